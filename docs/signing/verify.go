// Verify X-Anarchon-Signature v2/v3 in a Go app (standard library only).
//
// v3 also binds X-Anarchon-Trigger and X-Anarchon-Previous-Scheduled-At. A
// request with a v3= entry is checked by v3; one without is checked by v2
// and refused when it carries either of those two headers.
//
// Copy Verifier into your app. One instance per process, shared by every
// request (it remembers the runs it accepted, for the replay rule):
//
//	v := NewVerifier([][]byte{secret}, 300*time.Second) // during a rotation: current, next
//	func handler(w http.ResponseWriter, r *http.Request) {
//		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
//		if err == nil {
//			err = v.Verify(r.Method, r.RequestURI, r.Header, body, time.Now())
//		}
//		if err != nil {
//			http.Error(w, "bad signature", http.StatusUnauthorized)
//			return
//		}
//		...
//	}
//
// r.RequestURI is the request target exactly as received (path and query,
// undecoded); r.Header keeps repeated headers, so a signed header sent
// twice is refused rather than merged.
//
// `go run verify.go vectors.json` runs the test vectors and prints one line
// per step: "<case> <step> <result>" (the repository's tests compare them).
package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SignatureError says why a request was refused: Reason is "malformed",
// "expired", "mismatch" or "replay".
type SignatureError struct{ Reason, Detail string }

func (e *SignatureError) Error() string { return e.Reason + ": " + e.Detail }

type replayKey struct{ runID, attempt string }

// Verifier checks v2 signatures with any of its secrets and refuses a run
// id + attempt it already accepted within the window.
type Verifier struct {
	secrets [][]byte
	window  time.Duration
	mu      sync.Mutex
	seen    map[replayKey]int64 // forget after (unix seconds)
}

func NewVerifier(secrets [][]byte, window time.Duration) *Verifier {
	return &Verifier{secrets: secrets, window: window, seen: map[replayKey]int64{}}
}

// Verify returns nil if the request is signed, fresh and new.
func (v *Verifier) Verify(method, target string, h http.Header, body []byte, now time.Time) error {
	one := func(name string) (string, bool, error) {
		vals := h.Values(name)
		if len(vals) > 1 {
			return "", false, &SignatureError{"malformed", name + " sent more than once"}
		}
		if len(vals) == 0 {
			return "", false, nil
		}
		return strings.Trim(vals[0], " \t"), true, nil
	}
	field := map[string]string{}
	present := map[string]bool{}
	for _, name := range []string{"X-Anarchon-Job", "X-Anarchon-Slot", "X-Anarchon-Run-Id",
		"X-Anarchon-Attempt", "X-Anarchon-Fence", "X-Anarchon-Trigger",
		"X-Anarchon-Previous-Scheduled-At", "X-Anarchon-Signature"} {
		val, ok, err := one(name)
		if err != nil {
			return err
		}
		field[name], present[name] = val, ok
	}
	if !present["X-Anarchon-Signature"] {
		return &SignatureError{"malformed", "no X-Anarchon-Signature"}
	}
	var stamps, macs, macsV3 []string
	for _, entry := range strings.Split(field["X-Anarchon-Signature"], ",") {
		key, value, _ := strings.Cut(strings.TrimSpace(entry), "=")
		switch key {
		case "t":
			stamps = append(stamps, value)
		case "v2":
			macs = append(macs, value)
		case "v3":
			macsV3 = append(macsV3, value)
		}
	}
	if len(stamps) != 1 || !allDigits(stamps[0]) {
		return &SignatureError{"malformed", "t= must appear once, as unix seconds"}
	}
	t, err := strconv.ParseInt(stamps[0], 10, 64)
	if err != nil {
		return &SignatureError{"malformed", "t= out of range"}
	}
	if len(macs) == 0 && len(macsV3) == 0 {
		return &SignatureError{"malformed", "no v2= entry"}
	}
	v3 := len(macsV3) > 0
	if !v3 && (present["X-Anarchon-Trigger"] || present["X-Anarchon-Previous-Scheduled-At"]) {
		return &SignatureError{"malformed", "a header only v3 signs, without v3="}
	}
	for _, name := range []string{"X-Anarchon-Job", "X-Anarchon-Slot", "X-Anarchon-Run-Id"} {
		if !present[name] {
			return &SignatureError{"malformed", "missing " + name}
		}
	}
	nowSec := float64(now.UnixNano()) / 1e9
	if math.Abs(nowSec-float64(t)) > v.window.Seconds() {
		return &SignatureError{"expired", "t= is outside the window"}
	}
	attempt := field["X-Anarchon-Attempt"]
	if attempt == "" {
		attempt = "1"
	}
	sum := sha256.Sum256(body)
	label, scheme := "anarchon-v2", "v2"
	if v3 {
		label, scheme = "anarchon-v3", "v3"
	}
	lines := []string{label, stamps[0], method, target, field["X-Anarchon-Job"],
		field["X-Anarchon-Slot"], field["X-Anarchon-Run-Id"], attempt,
		field["X-Anarchon-Fence"], hex.EncodeToString(sum[:])}
	if v3 {
		lines = append(lines, field["X-Anarchon-Trigger"], field["X-Anarchon-Previous-Scheduled-At"])
		macs = macsV3
	}
	for _, line := range lines {
		if strings.ContainsAny(line, "\r\n") {
			return &SignatureError{"malformed", "CR or LF in a signed field"}
		}
	}
	message := []byte(strings.Join(lines, "\n"))
	matched := 0
	for _, secret := range v.secrets {
		mac := hmac.New(sha256.New, secret)
		mac.Write(message)
		want := []byte(hex.EncodeToString(mac.Sum(nil)))
		for _, given := range macs {
			// Constant time; every pair is compared, no early exit.
			if hmac.Equal(want, []byte(given)) {
				matched++
			}
		}
	}
	if matched == 0 {
		return &SignatureError{"mismatch", "no " + scheme + "= entry matches a secret"}
	}
	// The replay rule, only for requests that passed the checks above.
	key := replayKey{field["X-Anarchon-Run-Id"], attempt}
	v.mu.Lock()
	defer v.mu.Unlock()
	for k, until := range v.seen {
		if float64(until) < nowSec {
			delete(v.seen, k)
		}
	}
	if _, dup := v.seen[key]; dup {
		return &SignatureError{"replay", "run " + key.runID + " attempt " + key.attempt + " already accepted"}
	}
	v.seen[key] = t + int64(v.window/time.Second)
	return nil
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func main() {
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var vectors struct {
		Verify []struct {
			Name    string
			Secrets []string
			Window  int64
			Steps   []struct {
				Now     int64
				Request struct {
					Method, Target, Body string
					Headers              [][2]string
				}
			}
		}
	}
	if err := json.Unmarshal(raw, &vectors); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, c := range vectors.Verify {
		secrets := [][]byte{}
		for _, s := range c.Secrets {
			secrets = append(secrets, []byte(s))
		}
		v := NewVerifier(secrets, time.Duration(c.Window)*time.Second)
		for i, step := range c.Steps {
			h := http.Header{}
			for _, pair := range step.Request.Headers {
				h.Add(pair[0], pair[1])
			}
			result := "ok"
			err := v.Verify(step.Request.Method, step.Request.Target, h,
				[]byte(step.Request.Body), time.Unix(step.Now, 0))
			if err != nil {
				result = err.(*SignatureError).Reason
			}
			fmt.Printf("%s %d %s\n", c.Name, i, result)
		}
	}
}
