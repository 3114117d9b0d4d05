"""Tool-call parsing (`--tool-call-parser`), after SGLang 0.5.4's srt/function_call."""
