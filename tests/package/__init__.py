"""Repository-wide checks: links and packaging, the reader's runtime, one API across the families, the debug
and interpreter switches."""
