"""An example `dg` project: a stream asset, its sensor and lag check declared in YAML (defs/)."""
