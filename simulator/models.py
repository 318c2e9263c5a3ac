"""Models of this app arrive with the issue that builds it."""
