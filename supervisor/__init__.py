"""The flower supervisor: one parent per flower run, one child process per step attempt."""
