"""FP8 quantization: the math, checkpoints in and out, and the quality check."""
