"""Generate a tiny random Llama with a locally trained byte-level BPE tokenizer (deterministic, no network)."""

# How it works: a seeded generator writes a synthetic corpus of scheduling-flavoured sentences, a byte-level
# BPE tokenizer is trained on it (all 256 bytes in the alphabet, so no text is ever unknown), and a 2-layer
# Llama whose vocabulary is exactly the tokenizer's is initialised from a fixed torch seed and saved in bf16.
# The lm_head is scaled up so greedy decoding does not collapse onto one token. Running the script twice
# gives byte-identical weights and the same tokenizer; nothing is downloaded.

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")
VOCABULARY = (
    "the a of to in on for with from as is are was be and or not this that it each every some no "
    "system user assistant request batch token cache prefix chunk hash tree scheduler queue policy "
    "latency throughput memory page prompt reply model server engine decode prefill kernel layer "
    "feather flock together group share answer question document summary translate explain "
    "red green blue black white cat dog bird fish river mountain city ocean forest quick brown fox "
    "one two three four five six seven eight nine ten hundred thousand first last next before after"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    vocab_size: int = 1024
    hidden_size: int = 128
    num_layers: int = 2
    head_dim: int = 64
    max_positions: int = 16384
    num_corpus_lines: int = 3000
    seed: int = 20260529
    lm_head_scale: float = 10.0


def synthetic_corpus(spec: TinyModelSpec) -> list[str]:
    rng = random.Random(spec.seed)
    lines = []
    for _ in range(spec.num_corpus_lines):
        words = [rng.choice(VOCABULARY) for _ in range(rng.randint(4, 24))]
        if rng.random() < 0.2:
            words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 10**6)))
        lines.append(" ".join(words) + rng.choice(".?!,:;"))
    return lines


def train_tokenizer(spec: TinyModelSpec) -> PreTrainedTokenizerFast:
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(synthetic_corpus(spec), trainer=trainer)
    bos = ("<s>", bpe.token_to_id("<s>"))
    bpe.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[bos]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=spec.max_positions,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def init_model(spec: TinyModelSpec, tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    torch.manual_seed(spec.seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=2 * spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.hidden_size // spec.head_dim,
        num_key_value_heads=1,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="bfloat16",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(spec.lm_head_scale)
    return model.to(torch.bfloat16).eval()


def patch_json(path: Path, updates: dict, defaults: dict) -> None:
    data = json.loads(path.read_text())
    data.update(updates)
    for key, value in defaults.items():
        data.setdefault(key, value)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_model(out: Path, spec: TinyModelSpec) -> int:
    tokenizer = train_tokenizer(spec)
    model = init_model(spec, tokenizer)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    model.save_pretrained(out, safe_serialization=True)
    # transformers 4.x readers (engines pin either major version) need these older keys.
    patch_json(out / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"}, {})
    patch_json(out / "config.json", {}, {"rope_theta": 10000.0, "torch_dtype": "bfloat16"})
    return sum(p.numel() for p in model.parameters())


def greedy_check(out: Path) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(out)
    model = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for prompt in ("the quick brown fox", "scheduler queue policy", "feather flock together 42"):
        ids = tokenizer(prompt, return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=12, do_sample=False, pad_token_id=tokenizer.pad_token_id)
        print(f"{prompt!r} -> {tokenizer.decode(gen[0][ids['input_ids'].shape[1] :])!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, help="output folder, e.g. models/tiny-llama")
    parser.add_argument("--check", action="store_true", help="reload with transformers and decode greedily")
    args = parser.parse_args()
    spec = TinyModelSpec()
    num_params = write_model(args.out, spec)
    print(
        f"wrote {args.out}: vocab {spec.vocab_size}, hidden {spec.hidden_size}, "
        f"layers {spec.num_layers}, {num_params} parameters"
    )
    if args.check:
        greedy_check(args.out)


if __name__ == "__main__":
    main()
