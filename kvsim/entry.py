"""The ``kvsim`` command's entry point. The CLI's libraries (typer, rich, pydantic, numpy)
take a second or more to load; a Ctrl-C in that second exits 130 with one line, as it
does once a command runs, instead of a traceback."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from kvsim.cli import app
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted (SIGINT) while starting; nothing was written\n")
        raise SystemExit(130)
    app()


if __name__ == "__main__":
    main()
