"""The reader's test: the wheel installed into a fresh environment, the committed notebooks executed there."""
