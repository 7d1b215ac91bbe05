"""Exit codes of every `jaxseg-robust` command (the CLI and the commands below it share them).

  0  success: every item was processed;
  1  partial failure: the run finished but some items failed (named in the
     output and in the run's records);
  2  failure: bad arguments, nothing could be processed, or an unexpected
     internal error;
  130  interrupted (Ctrl-C, or SIGTERM as a batch scheduler sends before its kill).
"""

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_FAILURE = 2
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT

__all__ = ["EXIT_OK", "EXIT_PARTIAL", "EXIT_FAILURE", "EXIT_INTERRUPTED"]
