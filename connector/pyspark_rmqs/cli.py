"""The `rmqs` command (work in progress)."""


def main() -> None:
    raise SystemExit("rmqs: the command line is not built yet")
