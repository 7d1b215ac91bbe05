"""Readable results: Markdown/CSV tables and PNG plots for run directories, one module per protocol."""
