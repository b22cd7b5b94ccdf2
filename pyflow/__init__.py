"""pyflow."""
