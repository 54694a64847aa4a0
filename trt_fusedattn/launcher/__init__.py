"""Compile our CUDA sources to PTX (cached), take the caller's device arrays, and launch a launch plan."""
