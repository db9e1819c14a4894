"""What both vLLM backends (vllm_local/, vllm_machine/) share: the chat template and the token budget fit
(templated.py), the repetition guard of the step loop (repetition.py), returning freed heap memory (heap.py)."""
