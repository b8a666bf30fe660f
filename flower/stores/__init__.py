"""Session stores: SQLite at the bottom, trimming and pruning layered on top."""
