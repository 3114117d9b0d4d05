"""Grammar-guided (structured) decoding: json_schema, regex and ebnf constraints.

`base_grammar_backend` holds the interface and the compile cache, `grammar_registry` the
backends keyed by --grammar-backend; `xgrammar_backend` is the default implementation,
`llguidance_backend` and `outlines_backend` the alternatives (docs/grammar_backends.md);
`bitmask` applies a packed token bitmask to logits on any device. The scheduler side lives
in managers/scheduler_grammar.py.
"""
