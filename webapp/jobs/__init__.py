"""Model work besides training on the GPU workers: evaluations, LoRA merges, the playground."""
