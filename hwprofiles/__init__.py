"""Hardware profiles as YAML data (one file per GPU)."""
