"""``sft_qwen2_5_vl.py``, pipelined: the same fine-tuning with MPipe Transpose over ``--pp`` processes (the diff
against it is the import, the class and its ``mpipe_config``).

Usage: torchrun --standalone --nproc_per_node 2 examples/sft_qwen2_5_vl_pipelined.py --model demo/model
       accelerate launch --num_processes 2 examples/sft_qwen2_5_vl_pipelined.py --model demo/model
       torchrun --standalone --nproc_per_node 4 examples/sft_qwen2_5_vl_pipelined.py --cp 2
"""

import argparse

import torch
from transformers import AutoModelForImageTextToText, TrainingArguments
from transformers.loss.loss_utils import ForCausalLMLoss

from mpipe_hf import MPipeConfig, MPipeTrainer

from mpipe_hf.data import ConversationCollator, load_conversation_dataset
from mpipe_hf.data import load_checkpoint_processor


def token_loss(outputs, labels, num_items_in_batch=None):
    """The causal LM loss summed over the micro-batch's label tokens over the step's (``num_items_in_batch``): with
    it the Trainer normalises by the step's label tokens (Qwen2.5-VL declares ``accepts_loss_kwargs = False``)."""
    logits = outputs.logits
    return ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1], num_items_in_batch=num_items_in_batch)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo/model")
    parser.add_argument("--data", default="demo/data/train.jsonl")
    parser.add_argument("--eval-data", default=None)
    parser.add_argument("--output-dir", default="outputs/sft_pipelined")
    parser.add_argument("--max-steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--max-grad-norm", type=float, default=1.0)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--train-tower", action="store_true", help="train the visual tower too")
    parser.add_argument("--train-merger", action="store_true", help="train the merger, the ViT frozen")
    parser.add_argument("--save-steps", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=1, help="rows per micro-batch")
    parser.add_argument("--resume", default=None, help="a checkpoint-<step> directory to resume from")
    parser.add_argument("--token-loss", action="store_true", help="the step's summed token loss over its label "
                        "tokens (compute_loss_func), not the mean of the micro-batches' means")
    parser.add_argument("--lora", type=int, default=0, help="LoRA of this rank on the decoder's attention (peft); "
                        "0: full fine-tuning")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--cp", type=int, default=1, help="context parallelism: launch pp * cp processes")
    parser.add_argument("--packing", action="store_true", help="each micro-batch's rows packed into one sequence")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    processor = load_checkpoint_processor(args.model)  # AutoProcessor with torchvision, image-only without
    model = AutoModelForImageTextToText.from_pretrained(args.model, dtype=torch.float32)
    model.model.visual.requires_grad_(args.train_tower)
    model.model.visual.merger.requires_grad_(args.train_tower or args.train_merger)
    if args.lora:  # only the adapter trains; the checkpoints are PEFT's adapter files
        from peft import LoraConfig, get_peft_model
        torch.manual_seed(0)
        model = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    train = load_conversation_dataset(args.data, processor, max_length=2048)
    evaluation = load_conversation_dataset(args.eval_data, processor, max_length=2048) if args.eval_data else None
    training_args = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=8, learning_rate=args.learning_rate, lr_scheduler_type="linear", warmup_steps=2,
        weight_decay=0.01, adam_epsilon=1e-6, max_grad_norm=args.max_grad_norm, bf16=args.bf16, logging_steps=1,
        save_steps=args.save_steps, report_to="none", remove_unused_columns=False,
        train_sampling_strategy="sequential", use_cpu=not torch.cuda.is_available(), seed=0)
    pipeline = MPipeConfig(pp_size=args.pp, vpp=2, freeze_vit=args.train_merger,
                           preprocess="trainable" if args.train_tower or args.train_merger else "frozen",
                           packing=args.packing, cp_size=args.cp)
    trainer = MPipeTrainer(model=model, args=training_args, mpipe_config=pipeline, train_dataset=train,
                           eval_dataset=evaluation,
                           data_collator=ConversationCollator(processor, max_length=2048),
                           processing_class=processor, compute_loss_func=token_loss if args.token_loss else None)
    trainer.train(resume_from_checkpoint=args.resume)
    if evaluation is not None:
        print(trainer.evaluate())
    trainer.save_model()  # a directory from_pretrained loads
    trainer.save_state()  # trainer_state.json, with every step's log


if __name__ == "__main__":
    main()
