"""The project's definitions: everything under defs/ (`load_from_defs_folder`).

dagster dev -m dagster_rmqs.examples.components_project.definitions
"""

from pathlib import Path

from dagster import Definitions, definitions, load_from_defs_folder


@definitions
def defs() -> Definitions:
    return load_from_defs_folder(project_root=Path(__file__).parent)
