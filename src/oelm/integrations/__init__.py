"""oelm with other libraries: :mod:`~oelm.integrations.peft` (OELM as a PEFT method, LoRA on top; the
``peft`` extra; documented as ``oelm.peft``), :mod:`~oelm.integrations.lora` (a method's LoRA keys,
checked without PEFT) and :mod:`~oelm.integrations.trackers` (TensorBoard, Weights & Biases, MLflow
through Accelerate). Each is imported where it is used, never by ``import oelm``."""
