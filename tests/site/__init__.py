"""The built book (make book-build), checked in a real browser."""
