"""What the chapters show: the notebook runner, the plots and kernel drawings, the teaching helpers."""
