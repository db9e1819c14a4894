"""Model: the prompt, token budget and image-token math, presets, output formats, the extraction stage and the
post-filter that judges the model's output."""
