"""Synthetic tasks the book trains models on (chapter 8): MQAR, and the tiny grammar of `text`. Importing this
package loads no framework."""
