"""Multimodal inputs (images) from the request to the model.

mm_inputs.py: the data contract (MultimodalDataItem, MultimodalInputs) that the processors
build in the TokenizerManager, the scheduler carries on each Req and the models read from
the ForwardBatch. mm_utils.py: the model side (pad_input_ids pattern, the embedding routine
that merges image features with text embeddings). processors/: per-architecture turning of
raw images + prompt text into input ids and MultimodalInputs.
"""
