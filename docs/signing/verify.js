// Verify X-Anarchon-Signature v2/v3 in a Node.js app (no dependencies).
//
// v3 also binds X-Anarchon-Trigger and X-Anarchon-Previous-Scheduled-At. A
// request with a v3= entry is checked by v3; one without is checked by v2
// and refused when it carries either of those two headers.
//
// Copy Verifier into your app. One instance per process, shared by every
// request (it remembers the runs it accepted, for the replay rule):
//
//   const verifier = new Verifier([secret]); // during a rotation: [current, next]
//   http.createServer((req, res) => {
//     const chunks = [];
//     req.on('data', (c) => chunks.push(c));
//     req.on('end', () => {
//       try {
//         verifier.verify(req.method, req.url, pairs(req.rawHeaders), Buffer.concat(chunks));
//       } catch (err) {
//         res.writeHead(401).end('bad signature');
//         return;
//       }
//       ...
//     });
//   });
//
// req.url is the request target exactly as received (path and query,
// undecoded); req.rawHeaders keeps repeated headers, so a signed header sent
// twice is refused rather than merged (req.headers would join them).
//
// `node verify.js vectors.json` runs the test vectors and prints one line per
// step: "<case> <step> <result>" (the repository's tests compare them).
'use strict';

const crypto = require('node:crypto');

const SIGNED = ['x-anarchon-job', 'x-anarchon-slot', 'x-anarchon-run-id'];
const OPTIONAL = ['x-anarchon-attempt', 'x-anarchon-fence'];
const V3_ONLY = ['x-anarchon-trigger', 'x-anarchon-previous-scheduled-at'];
const SIGNATURE = 'x-anarchon-signature';

/** Refused; reason is "malformed", "expired", "mismatch" or "replay". */
class SignatureError extends Error {
  constructor(reason, detail) {
    super(`${reason}: ${detail}`);
    this.reason = reason;
  }
}

/** [name, value] pairs from Node's flat req.rawHeaders. */
function pairs(rawHeaders) {
  const out = [];
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) out.push([rawHeaders[i], rawHeaders[i + 1]]);
  return out;
}

class Verifier {
  /** secrets: Buffers or strings (UTF-8); windowSeconds: how far t may be from now. */
  constructor(secrets, windowSeconds = 300) {
    if (!secrets.length) throw new Error('at least one secret');
    this.secrets = secrets.map((s) => Buffer.from(s));
    this.window = windowSeconds;
    this.seen = new Map(); // "runId attempt" -> forget after (unix seconds)
  }

  /** Returns if the request is signed, fresh and new; else throws SignatureError. */
  verify(method, target, headerPairs, body, now = Date.now() / 1000) {
    const values = new Map();
    for (const [name, value] of headerPairs) {
      const key = name.toLowerCase();
      if (!values.has(key)) values.set(key, []);
      values.get(key).push(value.replace(/^[ \t]+|[ \t]+$/g, ''));
    }
    for (const name of [...SIGNED, ...OPTIONAL, ...V3_ONLY, SIGNATURE]) {
      if ((values.get(name) || []).length > 1) {
        throw new SignatureError('malformed', `${name} sent more than once`);
      }
    }
    if (!values.has(SIGNATURE)) throw new SignatureError('malformed', 'no X-Anarchon-Signature');
    const stamps = [];
    let macs = [];
    const macsV3 = [];
    for (const entry of values.get(SIGNATURE)[0].split(',')) {
      const trimmed = entry.trim();
      const eq = trimmed.indexOf('=');
      const key = eq < 0 ? trimmed : trimmed.slice(0, eq);
      const value = eq < 0 ? '' : trimmed.slice(eq + 1);
      if (key === 't') stamps.push(value);
      else if (key === 'v2') macs.push(value);
      else if (key === 'v3') macsV3.push(value);
    }
    if (stamps.length !== 1 || !/^[0-9]+$/.test(stamps[0])) {
      throw new SignatureError('malformed', 't= must appear once, as unix seconds');
    }
    if (!macs.length && !macsV3.length) throw new SignatureError('malformed', 'no v2= entry');
    const v3 = macsV3.length > 0;
    if (!v3 && V3_ONLY.some((name) => values.has(name))) {
      throw new SignatureError('malformed', 'a header only v3 signs, without v3=');
    }
    const missing = SIGNED.filter((name) => !values.has(name));
    if (missing.length) throw new SignatureError('malformed', `missing ${missing.join(', ')}`);
    const t = Number(stamps[0]);
    if (Math.abs(now - t) > this.window) {
      throw new SignatureError('expired', `t=${stamps[0]} is outside the ${this.window}s window`);
    }
    const get = (name, dflt) => (values.has(name) ? values.get(name)[0] : dflt);
    const attempt = get('x-anarchon-attempt', '') || '1';
    const lines = [
      v3 ? 'anarchon-v3' : 'anarchon-v2',
      stamps[0],
      method,
      target,
      get('x-anarchon-job'),
      get('x-anarchon-slot'),
      get('x-anarchon-run-id'),
      attempt,
      get('x-anarchon-fence', ''),
      crypto.createHash('sha256').update(body).digest('hex'),
    ];
    if (v3) {
      for (const name of V3_ONLY) lines.push(get(name, ''));
      macs = macsV3;
    }
    if (lines.some((line) => /[\r\n]/.test(line))) {
      throw new SignatureError('malformed', 'CR or LF in a signed field');
    }
    const message = Buffer.from(lines.join('\n'), 'utf8');
    let matched = false;
    for (const secret of this.secrets) {
      const want = Buffer.from(crypto.createHmac('sha256', secret).update(message).digest('hex'));
      for (const given of macs) {
        const got = Buffer.from(given);
        // timingSafeEqual needs equal lengths; the length of a MAC is no secret.
        // Every pair is compared, no early exit.
        if (got.length === want.length && crypto.timingSafeEqual(want, got)) matched = true;
      }
    }
    if (!matched) {
      throw new SignatureError('mismatch', `no ${v3 ? 'v3' : 'v2'}= entry matches a secret`);
    }
    // The replay rule, only for requests that passed the checks above.
    const runId = get('x-anarchon-run-id');
    const key = `${runId} ${attempt}`;
    for (const [k, until] of this.seen) if (until < now) this.seen.delete(k);
    if (this.seen.has(key)) {
      throw new SignatureError('replay', `run ${runId} attempt ${attempt} already accepted`);
    }
    this.seen.set(key, t + this.window);
  }
}

function runVectors(path) {
  const vectors = JSON.parse(require('node:fs').readFileSync(path, 'utf8'));
  for (const c of vectors.verify) {
    const verifier = new Verifier(c.secrets, c.window);
    c.steps.forEach((step, i) => {
      const r = step.request;
      let result = 'ok';
      try {
        verifier.verify(r.method, r.target, r.headers, Buffer.from(r.body, 'utf8'), step.now);
      } catch (err) {
        if (!(err instanceof SignatureError)) throw err;
        result = err.reason;
      }
      console.log(`${c.name} ${i} ${result}`);
    });
  }
}

module.exports = { Verifier, SignatureError, pairs };

if (require.main === module) runVectors(process.argv[2]);
