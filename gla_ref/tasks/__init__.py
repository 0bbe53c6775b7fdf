"""Synthetic tasks the book trains models on (MQAR, chapter 8). Importing this package loads no framework."""
