"""Messages between mini-sglang's processes, grouped by what they carry and who receives them
(SGLang 0.5.4's ``io_struct`` names). Every message is a plain picklable dataclass.

- ``generate``: request bodies and tokenized requests (HTTP -> TokenizerManager -> scheduler).
- ``output``: per-step outputs (scheduler -> detokenizer -> TokenizerManager).
- ``control``: control requests (TokenizerManager -> scheduler) and their replies.
- ``weights``: weight-update and memory-occupation requests and their replies.

Import each class from its module; this package re-exports nothing.
"""

from __future__ import annotations
