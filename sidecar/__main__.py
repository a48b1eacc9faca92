"""`python -m sidecar` and the `anarchon-sidecar` script.

Ctrl-C ends any command with one line and exit 130, never a traceback or
click's "Aborted!" (exit 1), even while the command line is still importing.
"""

import os
import sys


def interrupted() -> None:
    # os._exit: Python would turn an interrupt caught during an import into a
    # death by SIGINT at exit; there is nothing to clean up at this level.
    print("anarchon-sidecar: interrupted", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(130)


def entry() -> None:
    try:
        import click

        from sidecar.cli import main

        try:
            main.main(standalone_mode=False)
        except click.ClickException as exc:  # usage errors: as click shows them, exit 2
            exc.show()
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:  # Ctrl-C (or end of input) at a prompt
            interrupted()
    except KeyboardInterrupt:
        interrupted()


if __name__ == "__main__":
    entry()
