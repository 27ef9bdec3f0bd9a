"""The project's definitions: everything under defs/ (`load_from_defs_folder`).

`dg check defs` and `dg dev` load this module (`<root_module>.definitions`).
"""

from pathlib import Path

from dagster import Definitions, definitions, load_from_defs_folder


@definitions
def defs() -> Definitions:
    return load_from_defs_folder(path_within_project=Path(__file__).parent)
