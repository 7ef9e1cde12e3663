"""The model families oelm ships, registered on import (module names checked against transformers 5.x
sources; the table in :mod:`oelm.architectures` lists them)."""

from __future__ import annotations

from oelm.architectures.spec import ArchitectureSpec, AttentionSpec, register_architecture

_BERT_GROUPS = (
    ("norm", r"LayerNorm\."),
    ("embeddings", r"embeddings\."),
    ("attention_query", r"attention\.self\.query\."),
    ("attention_key", r"attention\.self\.key\."),
    ("attention_value", r"attention\.self\.value\."),
    ("attention_output", r"attention\.output\.dense\."),
    ("ffn", r"(intermediate|output)\.dense\."),
    ("head", r"(^|\.)(pooler|classifier|cls|qa_outputs|lm_head|discriminator_predictions|generator_predictions|generator_lm_head)\."),
)


def _bert_like(model_type: str, padded_positions: bool = False) -> ArchitectureSpec:
    # BertLayer: .attention.self (BertSelfAttention); decoders with add_cross_attention also
    # have .crossattention.self (BertCrossAttention), both with query/key/value nn.Linear.
    return ArchitectureSpec(
        model_type=model_type,
        attention=(
            AttentionSpec(r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.self$", "query", "key", kind="self"),
            AttentionSpec(r"(?:^|\.)encoder\.layer\.(\d+)\.crossattention\.self$", "query", "key", kind="cross"),
        ),
        num_heads="num_attention_heads",
        padded_positions=padded_positions,
        group_patterns=(
            ("norm", r"LayerNorm\."),
            ("embeddings", r"embeddings(_project)?\."),
            ("attention_query", r"attention\.self\.query\."),
            ("attention_key", r"attention\.self\.key\."),
            ("attention_value", r"attention\.self\.value\."),
            ("attention_output", r"attention\.output\.dense\."),
            ("ffn", r"(intermediate|output)\.dense\."),
            _BERT_GROUPS[-1],
        ),
    )


for _t in ("bert", "roberta", "xlm-roberta", "electra"):
    register_architecture(_bert_like(_t, padded_positions=_t in ("roberta", "xlm-roberta")))  # RoBERTa numbers positions from pad + 1

register_architecture(
    ArchitectureSpec(
        model_type="distilbert",
        attention_pattern=r"(?:^|\.)transformer\.layer\.(\d+)\.attention$",
        query="q_lin",
        key="k_lin",
        num_heads="n_heads",
        group_patterns=(
            ("norm", r"layer_norm\."),
            ("embeddings", r"embeddings\."),
            ("attention_query", r"attention\.q_lin\."),
            ("attention_key", r"attention\.k_lin\."),
            ("attention_value", r"attention\.v_lin\."),
            ("attention_output", r"attention\.out_lin\."),
            ("ffn", r"ffn\."),
            ("head", r"(^|\.)(pre_classifier|classifier|qa_outputs|vocab_transform|vocab_projector|vocab_layer_norm)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="deberta-v2",
        # DebertaV2Attention.self is a DisentangledSelfAttention with query_proj/key_proj/value_proj;
        # its pos_query_proj/pos_key_proj (relative-position projections) are not Q/K targets.
        attention_pattern=r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.self$",
        query="query_proj",
        key="key_proj",
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"LayerNorm\."),
            ("embeddings", r"(embeddings|rel_embeddings)\."),
            ("attention_query", r"attention\.self\.query_proj\."),
            ("attention_key", r"attention\.self\.key_proj\."),
            ("attention_value", r"attention\.self\.value_proj\."),
            ("attention_output", r"attention\.output\.dense\."),
            ("ffn", r"(intermediate|output)\.dense\."),
            ("head", r"(^|\.)(pooler|classifier|cls|qa_outputs|lm_predictions)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="gpt2",
        # GPT2Attention.c_attn: Conv1D(3*n_embd, n_embd), weight [n_embd, 3*n_embd], output q|k|v.
        attention_pattern=r"(?:^|\.)h\.(\d+)\.attn$",
        query="c_attn",
        fused="qkv_conv1d",
        num_heads="n_head",
        group_patterns=(
            ("norm", r"(^|\.)ln_(1|2|f)\."),
            ("embeddings", r"(^|\.)(wte|wpe)\."),
            ("attention_query", r"attn\.c_attn\.query\."),
            ("attention_key", r"attn\.c_attn\.key\."),
            ("attention_value", r"attn\.c_attn\.value\."),
            ("attention_qkv", r"attn\.c_attn\."),
            ("attention_output", r"attn\.c_proj\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|score|classifier|qa_outputs|multiple_choice_head)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="gpt_neox",
        # GPTNeoXAttention.query_key_value: nn.Linear(hidden, 3*hidden); forward views the output
        # as [..., num_heads, 3*head_size] and chunks q, k, v per head.
        attention_pattern=r"(?:^|\.)layers\.(\d+)\.attention$",
        query="query_key_value",
        fused="qkv_per_head",
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"(layernorm|final_layer_norm)\."),
            ("embeddings", r"(^|\.)embed_in\."),
            ("attention_query", r"attention\.query_key_value\.query\."),
            ("attention_key", r"attention\.query_key_value\.key\."),
            ("attention_value", r"attention\.query_key_value\.value\."),
            ("attention_qkv", r"attention\.query_key_value\."),
            ("attention_output", r"attention\.dense\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|embed_out|score|classifier|qa_outputs)\."),
        ),
    )
)
_DECODER_GROUPS = (
    ("norm", r"(layernorm|layer_norm|(^|\.)norm)\."),
    ("embeddings", r"(embed_tokens|embed_positions|project_in|project_out)\."),
    ("attention_query", r"self_attn\.q_proj\."),
    ("attention_key", r"self_attn\.k_proj\."),
    ("attention_value", r"self_attn\.v_proj\."),
    ("attention_output", r"self_attn\.(o_proj|out_proj)\."),
    ("ffn", r"(mlp\.|fc1\.|fc2\.)"),
    ("head", r"(^|\.)(lm_head|score|classifier|qa_outputs)\."),
)
for _t in ("llama", "mistral", "qwen2"):
    # <Family>Attention: q_proj [num_attention_heads*head_dim, hidden], k_proj/v_proj
    # [num_key_value_heads*head_dim, hidden]; head_dim from config.head_dim when set.
    register_architecture(
        ArchitectureSpec(
            model_type=_t,
            attention_pattern=r"(?:^|\.)layers\.(\d+)\.self_attn$",
            query="q_proj",
            key="k_proj",
            num_heads="num_attention_heads",
            num_kv_heads="num_key_value_heads",
            head_dim="head_dim",
            group_patterns=_DECODER_GROUPS,
        )
    )
register_architecture(
    ArchitectureSpec(
        model_type="opt",
        attention_pattern=r"(?:^|\.)decoder\.layers\.(\d+)\.self_attn$",
        query="q_proj",
        key="k_proj",
        num_heads="num_attention_heads",
        group_patterns=_DECODER_GROUPS,
    )
)
for _t in ("t5", "mt5", "umt5"):
    # T5Block.layer[0] = T5LayerSelfAttention(.SelfAttention), decoder blocks add
    # layer[1] = T5LayerCrossAttention(.EncDecAttention); T5Attention has q/k/v/o without bias,
    # inner_dim = num_heads * d_kv (d_kv need not be d_model / num_heads).
    register_architecture(
        ArchitectureSpec(
            model_type=_t,
            attention=(
                AttentionSpec(r"(?:^|\.)encoder\.block\.(\d+)\.layer\.\d+\.SelfAttention$", "q", "k", kind="encoder.self"),
                AttentionSpec(r"(?:^|\.)decoder\.block\.(\d+)\.layer\.\d+\.SelfAttention$", "q", "k", kind="decoder.self"),
                AttentionSpec(r"(?:^|\.)decoder\.block\.(\d+)\.layer\.\d+\.EncDecAttention$", "q", "k", kind="decoder.cross"),
            ),
            num_heads="num_heads",
            head_dim="d_kv",
            group_patterns=(
                ("norm", r"layer_norm\."),
                ("embeddings", r"(^|\.)(shared|embed_tokens|relative_attention_bias)\."),
                ("attention_query", r"Attention\.q\."),
                ("attention_key", r"Attention\.k\."),
                ("attention_value", r"Attention\.v\."),
                ("attention_output", r"Attention\.o\."),
                ("ffn", r"DenseReluDense\."),
                ("head", r"(^|\.)(lm_head|classification_head|classifier|qa_outputs)\."),
            ),
        )
    )


for _t in ("gemma", "phi"):
    # GemmaAttention / PhiAttention: q_proj [num_attention_heads*head_dim, hidden], k_proj/v_proj
    # [num_key_value_heads*head_dim, hidden] (Gemma's head_dim need not be hidden/heads); Phi's
    # output projection is self_attn.dense, its feed-forward mlp.fc1/fc2, its final norm final_layernorm.
    register_architecture(
        ArchitectureSpec(
            model_type=_t,
            attention_pattern=r"(?:^|\.)layers\.(\d+)\.self_attn$",
            query="q_proj",
            key="k_proj",
            num_heads="num_attention_heads",
            num_kv_heads="num_key_value_heads",
            head_dim="head_dim",
            group_patterns=(
                ("norm", r"(layernorm|layer_norm|(^|\.)norm)\."),
                ("embeddings", r"embed_tokens\."),
                ("attention_query", r"self_attn\.q_proj\."),
                ("attention_key", r"self_attn\.k_proj\."),
                ("attention_value", r"self_attn\.v_proj\."),
                ("attention_output", r"self_attn\.(o_proj|dense)\."),
                ("ffn", r"mlp\."),
                ("head", r"(^|\.)(lm_head|score|classifier|qa_outputs)\."),
            ),
        )
    )
register_architecture(
    ArchitectureSpec(
        model_type="vit",
        # transformers 5.x ViTLayer: .attention (ViTAttention) with q_proj/k_proj/v_proj/o_proj
        # (checkpoints in the older encoder.layer.N.attention.attention.query layout are renamed
        # on load); layernorm_before/after, mlp.fc1/fc2; embeddings: cls_token, patch projection.
        attention_pattern=r"(?:^|\.)layers\.(\d+)\.attention$",
        query="q_proj",
        key="k_proj",
        num_heads="num_attention_heads",
        group_patterns=(
            ("norm", r"layernorm(_before|_after)?\."),
            ("embeddings", r"embeddings\."),
            ("attention_query", r"attention\.q_proj\."),
            ("attention_key", r"attention\.k_proj\."),
            ("attention_value", r"attention\.v_proj\."),
            ("attention_output", r"attention\.o_proj\."),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(classifier|pooler)\."),
        ),
    )
)
register_architecture(
    ArchitectureSpec(
        model_type="bart",
        # BartEncoderLayer.self_attn; BartDecoderLayer.self_attn (causal) and .encoder_attn (cross:
        # queries from the decoder, keys from the encoder output); each a BartAttention with
        # q_proj/k_proj/v_proj/out_proj. Encoder and decoder have their own head counts.
        attention=(
            AttentionSpec(r"(?:^|\.)encoder\.layers\.(\d+)\.self_attn$", "q_proj", "k_proj", kind="encoder.self",
                          num_heads="encoder_attention_heads"),
            AttentionSpec(r"(?:^|\.)decoder\.layers\.(\d+)\.self_attn$", "q_proj", "k_proj", kind="decoder.self",
                          num_heads="decoder_attention_heads"),
            AttentionSpec(r"(?:^|\.)decoder\.layers\.(\d+)\.encoder_attn$", "q_proj", "k_proj", kind="decoder.cross",
                          num_heads="decoder_attention_heads"),
        ),
        num_heads="encoder_attention_heads",
        group_patterns=(
            ("norm", r"(layer_norm|layernorm_embedding|(^|\.)layernorm)\."),
            ("embeddings", r"(^|\.)(shared|embed_tokens|embed_positions)\."),
            ("attention_query", r"(self_attn|encoder_attn)\.q_proj\."),
            ("attention_key", r"(self_attn|encoder_attn)\.k_proj\."),
            ("attention_value", r"(self_attn|encoder_attn)\.v_proj\."),
            ("attention_output", r"(self_attn|encoder_attn)\.out_proj\."),
            ("ffn", r"\.fc(1|2)\."),
            ("head", r"(^|\.)(lm_head|classification_head|qa_outputs)\."),
        ),
    )
)


register_architecture(
    ArchitectureSpec(
        model_type="oelm-gpt",
        attention_pattern=r"(?:^|\.)h\.(\d+)\.attn$",
        query="q_proj",
        key="k_proj",
        num_heads="num_heads",
        num_layers="num_layers",  # oelm's GPTConfig (model_type "oelm-gpt") names them as nanoGPT does
        max_positions="context_length",
        group_patterns=(
            ("norm", r"(^|\.)ln_(1|2|f)\."),
            ("embeddings", r"(^|\.)(wte|wpe)\."),
            ("attention_query", r"attn\.q_proj\."),
            ("attention_key", r"attn\.k_proj\."),
            ("attention_value", r"attn\.v_proj\."),
            ("attention_output", r"attn\.o_proj\."),
            ("attention_map", r"attn\.fixed_logits$"),
            ("ffn", r"mlp\."),
            ("head", r"(^|\.)(lm_head|score)\."),
        ),
    )
)
