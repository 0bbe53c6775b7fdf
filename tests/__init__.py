"""The test suite of gla_ref: one folder per area (see each folder's __init__)."""
