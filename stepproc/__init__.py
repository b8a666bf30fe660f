"""The step child: runs one step attempt through the SDK and reports over the pipe."""
