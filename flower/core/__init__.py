"""flower's execution core: results, files in the run_dir, lineage, the runtime."""
