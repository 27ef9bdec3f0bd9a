"""The command line: `rmqs` (`app.py`, the command index; one module per command group) and the demo.

`main` is the console script's entry point (pyproject `[project.scripts]`: `pyspark_rmqs.cli:main`);
it loads the app only when called, so importing a command's module does not build the whole app.
"""

from __future__ import annotations


def main() -> None:
    """Run `rmqs` (the command index in `app.py`)."""
    from pyspark_rmqs.cli.app import main as run

    run()
