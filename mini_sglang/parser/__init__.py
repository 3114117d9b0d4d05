"""Text parsers of model output: reasoning sections (`--reasoning-parser`), after SGLang
0.5.4's srt/parser."""
