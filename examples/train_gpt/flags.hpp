#pragma once
// train_gpt's flags: their CLI11 definitions (add_flags) and the checks that run after parsing,
// before any file is opened or thread started (check_flags). Split from train_gpt.cpp's main()
// so that tests/fuzz/fuzz_cli.cpp parses argument vectors exactly as train_gpt does without
// training. Not a library header: examples/ only.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <loom/core/dropout.hpp>
#include <loom/core/error.hpp>
#include <loom/io/checkpoint/manifest.hpp>  // list_checkpoints, parse_checkpoint_dir_name
#include <loom/io/trace.hpp>
#include <loom/models/registry.hpp>
#include <loom/models/spec.hpp>

#include "options.hpp"

namespace train_gpt_cli {

/// A CLI11 check: the value is a whole number >= `least` in decimal digits (no sign, nothing
/// after it; "-1" is refused, not wrapped into an unsigned flag).
inline CLI::Validator whole_number(long least) {
  return CLI::Validator(
      [least](std::string& v) {
        const bool digits = !v.empty() && std::all_of(v.begin(), v.end(), [](char c) { return c >= '0' && c <= '9'; });
        errno = 0;
        const unsigned long long n = digits ? std::strtoull(v.c_str(), nullptr, 10) : 0;
        return digits && errno == 0 && n >= (unsigned long long)least
                   ? std::string()
                   : "'" + v + "' is not a whole number >= " + std::to_string(least) + " (pass " + std::to_string(least) +
                         " or more)";
      },
      "INT>=" + std::to_string(least));
}

/// `v` in %g form, for messages ("0.1", not "0.100000").
inline std::string shortest(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

/// A CLI11 check: the value is a finite number >= `least` (number_at_least) or > `least`
/// (number_above); the message says so in a few words ("'-1' is below 0: pass 0 or more")
/// where CLI::NonNegativeNumber writes out the largest double.
inline CLI::Validator number_bound(double least, bool strict) {
  return CLI::Validator(
      [least, strict](std::string& v) {
        char* end = nullptr;
        errno = 0;
        const double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
        if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(x))
          return "'" + v + "' is not a number";
        if (strict ? x > least : x >= least) return std::string();
        return "'" + v + "' is " + (strict && x == least ? "not above " : "below ") + shortest(least) + ": pass " +
               (strict ? "a number above " + shortest(least) : shortest(least) + " or more");
      },
      std::string(strict ? "NUMBER>" : "NUMBER>=") + shortest(least));
}
inline CLI::Validator number_at_least(double least) { return number_bound(least, false); }
inline CLI::Validator number_above(double least) { return number_bound(least, true); }

/// A Megatron-LM flag that only tunes PyTorch or GPU internals: accepted, with a note of what
/// loom does instead (apply_megatron_flags). `values`: the accepted values ("" for a switch,
/// "*" for any value).
struct internals_flag {
  const char* flag;
  const char* values;
  const char* note;
};
inline constexpr internals_flag megatron_internals[] = {
    {"--use-flash-attn", "", "loom's attention is a fused flash-style kernel already (--attention fused, the default)"},
    {"--use-fused-rmsnorm", "", "loom's normalisation is its own kernel; there is nothing to switch"},
    {"--no-masked-softmax-fusion", "", "loom's causal softmax is part of its attention kernel (--attention fused|reference)"},
    {"--no-bias-dropout-fusion", "", "loom's kernels are its own; there is no bias-dropout fusion to turn off"},
    {"--no-bias-gelu-fusion", "", "loom's kernels are its own; there is no bias-GELU fusion to turn off"},
    {"--no-rope-fusion", "", "loom's rotary embedding is its own kernel; there is no fusion to turn off"},
    {"--use-fused-rotary-pos-emb", "", "loom's rotary embedding is its own kernel already"},
    {"--use-fused-swiglu", "", "loom's SwiGLU is its own kernel already"},
    {"--transformer-impl", "local|transformer_engine", "loom's transformer is its own implementation (include/loom/nn)"},
    {"--use-mcore-models", "", "loom's models are its own (include/loom/models)"},
    {"--no-gradient-accumulation-fusion", "", "loom's weight-gradient GEMMs are its own; there is no fusion to turn off"},
    {"--overlap-grad-reduce", "", "loom overlaps the data-parallel gradient all-reduce with the backward pass by default "
                                  "(--no-overlap turns it off)"},
    {"--distributed-backend", "nccl|gloo|hccl", "loom chooses the communicator by --comm (threads or mpi) and --device "
                                                "(HCCL between NPUs)"},
    {"--async-save", "", "loom writes every checkpoint in the background already (the step waits only while the state "
                         "is copied)"},
    {"--use-dist-ckpt", "", "loom's checkpoints are one file per model-parallel rank and reshard onto any layout on load "
                            "already (docs/checkpoint.md)"},
    {"--tokenizer-type", "*", "loom uses the tokenizer of the --data dataset (its PREFIX.model, recorded in PREFIX.json); "
                              "a text file trains on bytes"},
    {"--tokenizer-model", "*", "loom uses the tokenizer of the --data dataset (its PREFIX.model, recorded in PREFIX.json); "
                               "a text file trains on bytes"},
};

/// Megatron-LM's names for what loom has under another form, or lacks (add_flags registers the
/// plain aliases, "--steps,--train-iters"); apply_megatron_flags maps or refuses them.
inline void add_megatron_flags(CLI::App& app, options& o) {
  const char* group = "Megatron-LM names (docs/megatron.md)";
  app.add_option("--data-path", o.data_path, "Megatron's --data: one dataset PREFIX (a weighted blend is refused)")
      ->expected(1, -1)->group(group);
  app.add_option("--load", o.load,
                 "Megatron's --resume: continue from the newest checkpoint in DIR (new checkpoints go to --save, "
                 "else to DIR); when DIR is --save's and holds none yet, start from step 0 (as Megatron)")->group(group);
  app.add_option("--lr-decay-style", o.lr_decay_style,
                 "cosine (loom's schedule: linear warm-up, cosine decay to --min-lr) or constant (--min-lr = --lr)")
      ->group(group);
  app.add_option("--lr-warmup-fraction", o.lr_warmup_fraction,
                 "warm-up as a fraction of the decay steps (--lr-decay-iters, default --train-iters), rounded to "
                 "whole steps; instead of --lr-warmup-iters")->group(group);
  app.add_option("--adam-beta1", o.adam_beta1, "AdamW's beta1, 0 <= beta1 < 1")->group(group);
  app.add_option("--adam-beta2", o.adam_beta2, "AdamW's beta2, 0 <= beta2 < 1 (loom's default 0.95; Megatron's 0.999)")
      ->group(group);
  app.add_option("--adam-eps", o.adam_eps, "AdamW's epsilon (> 0)")->group(group);
  app.add_option("--init-method-std", o.init_method_std,
                 "weights' initial standard deviation: loom's is 0.02 (residual projections 0.02/sqrt(2 x layers), "
                 "as Megatron's scaled init); other values are refused")->group(group);
  app.add_flag("--bf16", o.bf16, "--precision bf16")->group(group);
  app.add_flag("--fp16", o.fp16, "--precision fp16")->group(group);
  app.add_option("--tensor-model-parallel-size", o.tp_size, "--layout tp<T>pp<P>'s T")->check(CLI::Range(1, 99))->group(group);
  app.add_option("--pipeline-model-parallel-size", o.pp_size, "--layout tp<T>pp<P>'s P")->check(CLI::Range(1, 99))->group(group);
  app.add_option("--recompute-granularity", o.recompute_granularity, "--recompute full or selective")
      ->check(CLI::IsMember({"full", "selective"}))->group(group);
  app.add_flag("--recompute-activations", o.recompute_activations, "--recompute selective")->group(group);
  app.add_option("--recompute-method", o.recompute_method,
                 "with --recompute-granularity full: uniform with --recompute-num-layers 1 (loom recomputes each "
                 "layer from its own input); block and groups of layers are refused")
      ->check(CLI::IsMember({"uniform", "block"}))->group(group);
  app.add_option("--recompute-num-layers", o.recompute_num_layers, "see --recompute-method (1 only)")
      ->check(CLI::Range(1, 1 << 20))->group(group);
  app.add_flag("--sequence-parallel", o.sequence_parallel, "refused: loom has no sequence parallelism yet")->group(group);
  app.add_option("--context-parallel-size", o.context_parallel_size, "1 only: loom has no context parallelism yet")
      ->check(CLI::Range(1, 1 << 20))->group(group);
  app.add_option("--num-experts", o.num_experts, "refused: loom has no mixture-of-experts layers yet")->group(group);
  app.add_option("--expert-model-parallel-size", o.expert_parallel_size, "1 only: loom has no mixture-of-experts layers yet")
      ->check(CLI::Range(1, 1 << 20))->group(group);
  app.add_option("--virtual-pipeline-model-parallel-size", o.virtual_pipeline_size,
                 "1 only: loom's pipeline is 1F1B without interleaved stages")->check(CLI::Range(1, 1 << 20))->group(group);
  app.add_option("--split", o.split, "refused: loom holds out --val-fraction of the data and has no test split")
      ->group(group);
  app.add_option("--ckpt-step", o.ckpt_step, "with --load DIR: continue from DIR/step_N (--resume DIR/step_NNNNNNNN)")
      ->check(whole_number(0))->group(group);
  const std::string whole_state =
      "refused: a checkpoint is loaded and saved whole (parameters, optimizer, data position); see docs/megatron.md";
  for (const char* f : {"--finetune", "--no-load-optim", "--no-load-rng", "--no-save-optim", "--no-save-rng"})
    app.add_flag(f, whole_state)->group(group);
  app.add_option("--exit-duration-in-mins", o.exit_duration_in_mins,
                 "--time-budget in minutes: stop training after this many minutes, saving a checkpoint")
      ->check(number_at_least(0))->group(group);
  for (const auto& f : megatron_internals) {
    const std::string help = std::string("accepted, changes nothing: ") + f.note;
    if (*f.values == 0) {
      app.add_flag(f.flag, help)->group(group);
    } else {
      auto* opt = app.add_option(f.flag, help)->type_name("TEXT")->expected(1)->group(group);
      if (std::string(f.values) != "*") {
        std::vector<std::string> allowed;
        for (std::string v = f.values; !v.empty();) {
          const auto bar = v.find('|');
          allowed.push_back(v.substr(0, bar));
          v = bar == std::string::npos ? "" : v.substr(bar + 1);
        }
        opt->check(CLI::IsMember(allowed));
      }
    }
  }
}

/// Registers every flag of train_gpt on `app`; parsing writes them into `o`, which must
/// outlive `app`. The flags' help strings are train_gpt's --help.
inline void add_flags(CLI::App& app, options& o) {
  app.option_defaults()->always_capture_default();  // --help shows every default
  app.add_option("--data", o.data, "UTF-8 text file (e.g. ../shared/data/tinyshakespeare.txt), or a dataset written by "
                                   "prepare_data: its prefix or its .idx/.bin (e.g. out/shakespeare); required");
  std::vector<std::string> models;
  for (const auto& m : loom::models::preset_specs()) models.emplace_back(m.name);
  app.add_option("--model", o.model,
                 "model preset: " + loom::models::model_names() + ", llama_100m, llama2_7b, odd_gqa; or the shape "
                 "flags below, or --model-config" +
                     " (default: quickstart for a text file, quickstart_bpe for a dataset)")
      ->check(CLI::IsMember(models));
  app.add_option("--steps,--train-iters", o.steps, "optimizer steps (>= 1)")->check(whole_number(1));
  app.add_option("--micro-batch,--micro-batch-size", o.micro_batch,
                 "sequences per micro-batch (0 or unset: a compiled instance's capacity, 4 for one compiled on first use)");
  app.add_option("--seq-len,--seq-length", o.seq_len, "tokens per sequence (default: the model's maximum)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step");
  app.add_option("--lr", o.lr, "peak learning rate");
  app.add_option("--min-lr", o.min_lr, "learning-rate floor after the cosine decay");
  app.add_option("--warmup,--lr-warmup-iters", o.warmup, "linear warm-up steps (<= --steps; default: --steps / 10, at most 100)")->check(whole_number(0));
  app.add_option("--decay-steps,--lr-decay-iters", o.decay_steps,
                 "step at which the cosine decay reaches --min-lr, which stays after it (default: --steps; "
                 "pass a checkpoint's to extend its run on the same schedule)")
      ->check(whole_number(1));
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (matrices only)");
  app.add_option("--max-grad-norm,--clip-grad", o.max_grad_norm, "clip the global gradient norm (0: off)");
  app.add_option("--dropout", o.dropout,
                 "dropout probability P, 0 <= P < 1, on the embedding, the attention probabilities and both residual "
                 "branches while training (not in validation or sampling); 0 (default): off; CPU only");
  app.add_option("--recompute", o.recompute,
                 "activation recomputation: none (default), selective (rerun the attention core and the MLP "
                 "activation in backward) or full (keep each block's input only, rerun the block); same losses, "
                 "less activation memory, more time")
      ->check(CLI::IsMember({"none", "selective", "full"}));
  app.add_option("--val-fraction", o.val_fraction, "held out for validation: a fraction of a text file's bytes, of a dataset's documents");
  app.add_option("--eval-every,--eval-interval", o.eval_every, "steps between validation evaluations (0: only at the end)")
      ->check(whole_number(0));
  app.add_option("--eval-windows,--eval-iters", o.eval_windows,
                 "validation windows (sequences) per periodic evaluation: the first N of the validation split (all if "
                 "it has fewer); as --eval-iters it counts sequences, not Megatron's global batches")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--early-stop", o.early_stop,
                 "PATIENCE: end training when the validation loss has not improved for PATIENCE periodic evaluations "
                 "(--eval-every); the saved weights, final validation and sample are then the best evaluation's (0: off)")
      ->check(whole_number(0));
  app.add_option("--seed", o.seed, "seed for initialisation, data order and sampling (>= 0)")->check(whole_number(0));
  app.add_option("--time-budget", o.time_budget, "stop training after this many seconds (0: no limit)");
  app.add_option("--log-dir", o.log_dir,
                 "TensorBoard events, metrics.jsonl and trace.json go here (default: logs/ in --out's directory, "
                 "out/logs for the default --out; '' = none)");
  app.add_option("--profile-steps", o.profile_steps, "record a Chrome/Perfetto timeline of steps A:B (half-open), off by default");
  app.add_option("--peak-gflops", o.peak_gflops,
                 "peak GFLOP/s per rank for MFU (default: on the CPU the peak of the unit the precision's GEMMs "
                 "run on, measured at start-up (fp32 FMA; bf16 on AMX-BF16 or VDPBF16PS), the SoC's table row on an NPU)");
  app.add_flag("--synthetic-data", o.synthetic_data,
               "isolation switch: train on 8 batches of random ids made once in memory (no loader, no data_wait); "
               "shows whether data loading limits the step");
  app.add_flag("--no-data-checksum", o.no_data_checksum,
               "do not check a dataset's .bin and .idx against the sizes and XXH3-64 checksums in PREFIX.json "
               "(one read of both files at start-up; for datasets too large to read twice)");
  app.add_option("--summary-every", o.summary_every, "steps between breakdown tables (0: never)");
  app.add_option("--out", o.out,
                 "where to save the weights (default out/<model>.safetensors); a file already there (an earlier "
                 "run's) is kept as <name>.previous-<k>.safetensors");
  app.add_option("--keep-previous", o.keep_previous,
                 "earlier runs' weights (<name>.previous-<k>.safetensors) and logs (--log-dir's metrics.previous-<k>.jsonl, "
                 "previous-<k>/) kept; older ones are removed when a run keeps another (0: all)")
      ->check(whole_number(0));
  app.add_option("--sample-tokens", o.sample_tokens, "tokens to sample after training (bytes for a text file)");
  app.add_option("--prompt", o.prompt,
                 "prompt for the sample (for a dataset: normalized as prepare_data normalized its text, see docs/data.md)");
  app.add_option("--temperature", o.temperature, "sampling temperature");
  app.add_option("--top-k", o.top_k, "sample from the k most likely tokens (0: all)");
  app.add_option("--precision", o.precision,
                 "fp32, bf16 (16-bit weights/activations, fp32 masters) or fp16 (same, with dynamic loss scaling)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--checkpoint-dir,--save", o.checkpoint_dir,
                 "save checkpoints here (step_NNNNNNNN/ directories and a 'latest' pointer; off by default)");
  app.add_option("--save-every,--save-interval", o.save_every, "steps between checkpoints (0: only at the end of the run)")
      ->check(whole_number(0));
  app.add_option("--keep", o.keep, "newest checkpoints to keep (0: all)")->check(whole_number(0));
  auto* resume = app.add_option("--resume", o.resume,
                                "continue from the newest valid checkpoint in DIR (a --checkpoint-dir) or from one "
                                "step_NNNNNNNN directory, bit for bit; checkpoints keep going to DIR");
  app.add_flag("--discard-newer-checkpoints", o.discard_newer_checkpoints,
               "with --resume of an older checkpoint: move the newer checkpoints of --checkpoint-dir into its "
               "set-aside/ directory instead of refusing to run (they would be overwritten)");
  app.add_flag("--exit-on-save-failure", o.exit_on_save_failure,
               "stop the run at the first checkpoint save that fails (by default training goes on and the run "
               "exits with status 1 at its end)");
  app.add_flag("--exit-signal-handler", o.exit_signal_handler,
               "on SIGTERM or SIGINT finish the current step, save a checkpoint, print where and exit 0 (a second "
               "signal ends the process at once; what is on disk stays whole)");
  app.add_option("--exit-interval", o.exit_interval,
                 "end the run after the first step that is a multiple of N, saving a checkpoint (0: off)")
      ->check(whole_number(0));
  app.add_option("--stop-at-step", o.stop_at_step,
                 "end this run after this many completed steps, saving a checkpoint; the schedule still spans --steps")
      ->check(whole_number(0));
  app.add_option("--export-hf", o.export_hf,
                 "after training, write Hugging Face weights (GPT2LMHeadModel or LlamaForCausalLM: model.safetensors, "
                 "config.json) to this directory");
  app.add_option("--ranks", o.ranks, "data-parallel ranks as threads of this process (--comm threads)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--comm", o.comm,
                 "communicator: threads (--ranks N), mpi (run under mpirun -np N; needs a build with MPI), or hccl "
                 "(--device ascend: one process per NPU started with RANK_TABLE_FILE and RANK_ID, a rank-table launch)")
      ->check(CLI::IsMember({"threads", "mpi", "hccl"}));
  app.add_option("--bucket-mb", o.bucket_mb, "data parallel: gradient bucket size in MiB (a layer never splits)")
      ->check(number_above(0));
  app.add_flag("--no-overlap", o.no_overlap,
               "data parallel: run each bucket's all-reduce where it would start, blocking (communication not hidden)");
  app.add_flag("--zero1", o.zero1, "data parallel: shard the AdamW moments across ranks (ZeRO stage 1)");
  auto* offload = app.add_flag("--offload-optimizer", o.offload_optimizer,
               "--device ascend: keep the fp32 master weights and AdamW moments in pinned host memory and run the "
               "update on the host, streamed in chunks (ZeRO-Offload; not with --zero1; docs/memory.md)");
  app.add_option("--offload-overlap", o.offload_overlap,
                 "with --offload-optimizer: on (default) runs the host update beside the next step's forward, each "
                 "layer waiting for its own parameters; off finishes the update before the next step (same results)")
      ->needs(offload);
  app.add_option("--comm-timeout", o.comm_timeout,
                 "data parallel: seconds a collective may wait for the other ranks before the run stops with an "
                 "error naming them (0: wait forever)")
      ->check(number_at_least(0));
  app.add_option("--replica-check-every", o.replica_check_every,
                 "data parallel: compare a parameter checksum across ranks every N steps (0: never)")
      ->check(whole_number(0));
  app.add_option("--layout", o.layout,
                 "tensor x pipeline parallel degrees tp<TP>pp<PP> (any the model divides; one the build lacks is "
                 "compiled on first use); the world (--ranks or mpirun -np) is TP*PP*DP ranks, data parallel on top; "
                 "or auto: the fastest layout, micro-batch, recompute mode and ZeRO-1 whose memory plan fits "
                 "--memory-limit");
  app.add_option("--memory-limit", o.memory_limit,
                 "--layout auto: memory per rank, e.g. 24GiB, 512MiB, 64GB (the plan plus 100 MiB of runtime overhead "
                 "must fit)");
  app.add_option("--global-batch,--global-batch-size", o.global_batch,
                 "sequences per optimizer step over all ranks (default: --micro-batch, or the capacity, x "
                 "--grad-accum x DP); sets --grad-accum = this / (micro-batch x DP), which must divide; with "
                 "--layout auto, auto chooses --grad-accum, and --micro-batch and --recompute when they are not given")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--device", o.device,
                 "where to train: cpu, or ascend (one NPU per rank through CANN from ASCEND_HOME_PATH, HCCL between "
                 "ranks; docs/ascend.md)")
      ->check(CLI::IsMember({"cpu", "ascend"}));
  app.add_flag("--allow-fp32-matmul", o.allow_fp32_matmul,
               "--device ascend --precision fp32: run the matmuls in fp32 on the cube unit, deliberately (a fraction "
               "of its bf16/fp16 rate; precision::fp32_ascend_matmul)");
  app.add_flag("--no-device-timing", o.no_device_timing,
               "--device ascend: no step breakdown in device time (no stream events; the breakdown is then the host's "
               "enqueue time)");
  app.add_flag("--deterministic-mode,--deterministic", o.deterministic,
               "runs that repeat bit for bit (Megatron-Core's name): on --device ascend deterministic kernels "
               "(ACL_OPT_DETERMINISTIC) and HCCL reductions (HCCL_DETERMINISTIC=true), at a cost in speed; the CPU "
               "kernels are deterministic without it");
  app.add_option("--npu", o.npu, "--device ascend: the NPU ordinal of this process (default: the rank; a rank beyond "
                                 "the visible NPUs is refused)")
      ->check(CLI::Range(0, 1023));
  app.add_option("--attention", o.attention,
                 "attention kernel: fused (flash-style, online softmax) or reference (materialises the probabilities)")
      ->check(CLI::IsMember({"fused", "reference"}));
  app.add_option("--loss-scale,--initial-loss-scale", o.loss_scale, "fp16: the dynamic loss scaler's initial scale (> 0)");
  app.add_option("--log-every,--log-interval", o.log_every,
                 "console: one line every N steps, plus the first and the last (>= 1); given, every line is kept "
                 "(otherwise a terminal shows one line redrawn in place)")
      ->check(CLI::Range(1L, 1L << 40));
  app.add_option("--workers", o.workers, "loader prefetch threads for a prepare_data dataset (0: read on the training thread)")
      ->check(CLI::Range(0, 64));
  app.add_flag("--list-instances", o.list_instances,
               "print the compiled (model, precision, layout, device, attention) instances and exit; with any of "
               "--model, --precision, --layout, --device, --attention, only those that match");
  app.add_flag("--prune-cache", o.prune_cache,
               "remove from the instance cache what this build never loads (instances of other loom headers or "
               "compilers, damaged ones, their precompiled headers, failed compile logs), say how much, and exit");
  app.add_option("--init-from-hf", o.init_from_hf,
                 "start from the Hugging Face weights (GPT-2 or Llama, as --model) in this directory (config.json, "
                 "model.safetensors)")
      ->excludes(resume);
  add_megatron_flags(app, o);
}

/// The largest --comm-timeout (seconds, about 31 years) and --bucket-mb (1 TiB) check_flags
/// accepts: beyond them the conversions to milliseconds and to bucket elements overflow.
inline constexpr double max_comm_timeout_s = 1e9, max_bucket_mb = 1 << 20;

/// --comm-timeout in milliseconds (0: wait forever). Requires check_flags to have passed.
inline std::chrono::milliseconds comm_timeout_ms(const options& o) {
  return std::chrono::milliseconds(static_cast<long long>(o.comm_timeout * 1000));
}

/// --log-dir when it is not given: `logs` beside the weights, in --out's directory (out/logs
/// for the default --out, out/<model>.safetensors; runs/a/logs for --out runs/a/w.safetensors;
/// logs for --out w.safetensors).
inline std::string default_log_dir(const std::string& out) {
  return ((out.empty() ? std::filesystem::path("out") : std::filesystem::path(out).parent_path()) / "logs").string();
}

/// --resume DIR where DIR is a directory that holds no checkpoint: neither a manifest.json (one
/// step_NNNNNNNN directory) nor a step_NNNNNNNN directory (a --checkpoint-dir; as
/// io::find_checkpoint, which verifies them later). Throws loom::input_error naming the fix: the
/// run's directory for a step_NNNNNNNN directory without its manifest (an unfinished or damaged
/// save), a subdirectory of DIR that holds checkpoints (--resume out for out/ckpt), else an
/// earlier run's --checkpoint-dir or no --resume. Reads only names and the file system's metadata.
inline void check_resume_directory(const std::string& resume) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (resume.empty() || !fs::is_directory(resume, ec)) return;
  const fs::path dir(resume);
  if (fs::exists(dir / "manifest.json", ec) || !loom::io::list_checkpoints(dir).empty()) return;
  const std::string what = "--resume '" + resume + "' holds no checkpoint (no manifest.json, no step_NNNNNNNN directory)";
  fs::path named = dir.lexically_normal();
  if (!named.has_filename()) named = named.parent_path();  // "out/ckpt/step_00000003/"
  if (loom::io::parse_checkpoint_dir_name(named.filename().string()) && named.has_parent_path())
    throw loom::input_error(what + "; a step_NNNNNNNN directory without manifest.json is an unfinished or damaged "
                            "save: pass the run's directory, --resume " + named.parent_path().string() +
                            ", to resume from its newest valid checkpoint");
  // one level down: --resume out for out/ckpt (increment(ec): an unreadable entry ends the look)
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code ec2;
    if (it->is_directory(ec2) && !loom::io::list_checkpoints(it->path()).empty())
      throw loom::input_error(what + "; its subdirectory '" + it->path().filename().string() +
                              "' does: pass --resume " + it->path().string());
  }
  throw loom::input_error(what + "; pass the --checkpoint-dir of an earlier run (e.g. out/ckpt) or one step_NNNNNNNN "
                          "directory inside it, or start without --resume");
}

/// A file where a checkpoint directory is expected: --checkpoint-dir names an existing file
/// (or a path through one) or the same path as --out, or --resume names a file; or a
/// --resume directory that holds no checkpoint (check_resume_directory). Throws
/// loom::input_error saying what is wrong and what to pass instead: for a file inside a
/// checkpoint (manifest.json, a shard) or a run's root (`latest`), that directory. Reads only
/// names and the file system's metadata.
inline void check_checkpoint_paths(const options& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!o.checkpoint_dir.empty()) {
    fs::path p(o.checkpoint_dir);  // the longest prefix that exists must be a directory
    while (!p.empty() && !fs::exists(p, ec) && p.has_parent_path() && p.parent_path() != p) p = p.parent_path();
    if (!p.empty() && fs::exists(p, ec) && !fs::is_directory(p, ec))
      throw loom::input_error("--checkpoint-dir '" + o.checkpoint_dir + "': '" + p.string() + "' is a file, and "
                              "checkpoints go into a directory (step_NNNNNNNN/ and 'latest'); pass a directory name "
                              "such as out/ckpt (the file is left as it is)");
  }
  if (!o.checkpoint_dir.empty() && !o.out.empty() &&
      fs::weakly_canonical(fs::absolute(o.checkpoint_dir, ec), ec) == fs::weakly_canonical(fs::absolute(o.out, ec), ec))
    throw loom::input_error("--checkpoint-dir and --out name the same path '" + o.out + "': the checkpoints are a "
                            "directory and the weights a file beside them; pass e.g. --checkpoint-dir out/ckpt "
                            "--out out/model.safetensors");
  if (!o.resume.empty() && fs::exists(o.resume, ec) && !fs::is_directory(o.resume, ec)) {
    const fs::path parent = fs::path(o.resume).parent_path();
    const bool inside =
        !parent.empty() && (fs::exists(parent / "manifest.json", ec) || fs::exists(parent / "latest", ec));
    throw loom::input_error("--resume '" + o.resume + "' is a file, and a checkpoint is a directory; pass " +
                            (inside ? "the directory that holds it, --resume " + parent.string()
                                    : std::string("the --checkpoint-dir of an earlier run (e.g. out/ckpt) or one "
                                                  "step_NNNNNNNN directory inside it")));
  }
  check_resume_directory(o.resume);
}

/// Maps Megatron-LM's names without a plain loom alias (add_megatron_flags) onto loom's options,
/// before check_flags and before --data is opened: --data-path, --load, --bf16/--fp16, the
/// tensor and pipeline sizes, the recompute flags, --lr-decay-style, --lr-warmup-fraction; checks
/// the AdamW numbers and --init-method-std; adds a note to o.notes for each flag that only tunes
/// PyTorch or GPU internals. Throws loom::input_error naming the flag for a feature loom lacks
/// and for two flags that say different things (--bf16 --precision fp32).
inline void apply_megatron_flags(options& o, const CLI::App& app) {
  using loom::input_error;
  auto given = [&](const char* flag) { return app.count(flag) > 0; };
  // features loom lacks: refused by name
  if (o.sequence_parallel)
    throw input_error("--sequence-parallel: loom has no sequence parallelism yet (its tensor parallelism keeps the "
                      "activations outside the matmuls whole on each rank); drop it");
  if (o.context_parallel_size > 1)
    throw input_error("--context-parallel-size " + std::to_string(o.context_parallel_size) + ": loom has no context "
                      "parallelism yet; drop it (or pass 1)");
  if (given("--num-experts") || o.expert_parallel_size > 1)
    throw input_error(std::string(given("--num-experts") ? "--num-experts" : "--expert-model-parallel-size") +
                      ": loom has no mixture-of-experts layers yet; drop it");
  if (o.virtual_pipeline_size > 1)
    throw input_error("--virtual-pipeline-model-parallel-size " + std::to_string(o.virtual_pipeline_size) + ": loom's "
                      "pipeline is 1F1B without interleaved (virtual) stages; drop it (or pass 1)");
  if (given("--split"))
    throw input_error("--split " + o.split + ": loom holds out --val-fraction of a dataset's documents (of a text "
                      "file's bytes) for validation and has no test split; pass e.g. --val-fraction 0.05 instead");
  // the data
  if (!o.data_path.empty()) {
    if (given("--data"))
      throw input_error("--data and --data-path both name the data; pass one of them");
    if (o.data_path.size() > 1)
      throw input_error("--data-path with " + std::to_string(o.data_path.size()) + " values is a blend of datasets "
                        "(weight prefix ...): blending is not supported yet; pass one dataset, --data-path PREFIX");
    o.data = o.data_path.front();
  }
  for (const char* f : {"--finetune", "--no-load-optim", "--no-load-rng"})
    if (given(f))
      throw input_error(std::string(f) + ": loom loads a checkpoint whole (parameters, optimizer state, step, data "
                        "position) to continue it exactly; to start a new run from trained weights, export them "
                        "(--export-hf DIR at the end of the run) and pass --init-from-hf DIR");
  for (const char* f : {"--no-save-optim", "--no-save-rng"})
    if (given(f))
      throw input_error(std::string(f) + ": loom's checkpoints always hold the whole state, so that a resume repeats "
                        "the run exactly; drop it (--out writes the weights alone at the end of the run)");
  if (given("--ckpt-step")) {
    if (!given("--load"))
      throw input_error("--ckpt-step " + std::to_string(o.ckpt_step) + " chooses a step of --load's directory; pass "
                        "--load DIR too, or --resume DIR/step_NNNNNNNN");
    char name[32];
    std::snprintf(name, sizeof name, "step_%08ld", o.ckpt_step);
    o.load = (std::filesystem::path(o.load) / name).string();
  }
  if (given("--exit-duration-in-mins")) {
    if (given("--time-budget"))
      throw input_error("--exit-duration-in-mins and --time-budget both bound the run's time; pass one of them");
    o.time_budget = 60.0 * o.exit_duration_in_mins;
  }
  // checkpoints: --load DIR is --resume DIR; as Megatron, a --save directory with no checkpoint yet starts at step 0
  if (given("--load")) {
    if (given("--resume")) throw input_error("--load and --resume both name the checkpoint to continue from; pass one");
    if (given("--init-from-hf"))
      throw input_error("--load continues a run, --init-from-hf starts one from Hugging Face weights; pass one of them");
    namespace fs = std::filesystem;
    std::error_code ec;
    const bool none = !fs::exists(o.load, ec) || (fs::is_directory(o.load, ec) && !fs::exists(fs::path(o.load) / "manifest.json", ec) &&
                                                  loom::io::list_checkpoints(o.load).empty());
    const bool same = !o.checkpoint_dir.empty() &&
                      fs::weakly_canonical(fs::absolute(o.load, ec), ec) == fs::weakly_canonical(fs::absolute(o.checkpoint_dir, ec), ec);
    if (!same && !fs::exists(o.load, ec))
      throw input_error("--load '" + o.load + "' does not exist; pass the --save directory of an earlier run (e.g. "
                        "out/ckpt), the same directory as --save to start there from step 0, or drop --load");
    if (none && same)
      o.notes.push_back("note: --load '" + o.load + "' holds no checkpoint yet: starting from step 0 (checkpoints go "
                        "there, --save)");
    else
      o.resume = o.load;
  }
  // precision
  if (o.bf16 && o.fp16) throw input_error("--bf16 and --fp16 both choose the precision; pass one of them");
  if (o.bf16 || o.fp16) {
    const std::string p = o.bf16 ? "bf16" : "fp16";
    if (given("--precision") && o.precision != p)
      throw input_error("--" + p + " and --precision " + o.precision + " choose different precisions; pass one of them");
    o.precision = p;
  }
  // layout
  if (given("--tensor-model-parallel-size") || given("--pipeline-model-parallel-size")) {
    const std::string l = "tp" + std::to_string(o.tp_size) + "pp" + std::to_string(o.pp_size);
    if (given("--layout") && o.layout != l)
      throw input_error("--tensor-model-parallel-size " + std::to_string(o.tp_size) + " --pipeline-model-parallel-size " +
                        std::to_string(o.pp_size) + " is --layout " + l + ", but --layout " + o.layout +
                        " is given too; pass one of them");
    o.layout = l;
  }
  // activation recomputation
  std::string r = o.recompute_activations ? "selective" : o.recompute_granularity;
  if (o.recompute_activations && !o.recompute_granularity.empty() && o.recompute_granularity != r)
    throw input_error("--recompute-activations (selective) and --recompute-granularity " + o.recompute_granularity +
                      " say different things; pass one of them");
  if ((given("--recompute-method") || given("--recompute-num-layers")) && r != "full")
    throw input_error("--recompute-method and --recompute-num-layers are for --recompute-granularity full; pass it, "
                      "or drop them");
  if (o.recompute_method == "block" || o.recompute_num_layers != 1)
    throw input_error("--recompute-method " + (o.recompute_method.empty() ? std::string("uniform") : o.recompute_method) +
                      " --recompute-num-layers " + std::to_string(o.recompute_num_layers) + ": loom's full "
                      "recomputation reruns every layer from its own input (Megatron's --recompute-method uniform "
                      "--recompute-num-layers 1); recomputing only some layers, or groups of them, is not supported "
                      "yet; pass --recompute-method uniform --recompute-num-layers 1");
  if (!r.empty()) {
    if (given("--recompute") && o.recompute != r)
      throw input_error("--recompute " + o.recompute + " and Megatron's recompute flags (" + r + ") say different "
                        "things; pass one of them");
    o.recompute = r;
  }
  // the learning-rate schedule
  if (o.lr_decay_style == "constant") {
    if (given("--min-lr") && o.min_lr != o.lr)
      o.notes.push_back("warning: --lr-decay-style constant keeps the learning rate at --lr after the warm-up: "
                        "--min-lr " + shortest(o.min_lr) + " has no effect");
    o.min_lr = o.lr;
  } else if (o.lr_decay_style != "cosine") {
    throw input_error("--lr-decay-style " + o.lr_decay_style + ": loom's schedule is a linear warm-up, then a cosine "
                      "decay to --min-lr (cosine) or none (constant); " + o.lr_decay_style + " is not implemented "
                      "yet; pass --lr-decay-style cosine or constant");
  }
  if (given("--lr-warmup-fraction")) {
    if (given("--warmup"))
      throw input_error("--lr-warmup-fraction and --lr-warmup-iters (--warmup) both set the warm-up; pass one of them");
    if (!(o.lr_warmup_fraction >= 0 && o.lr_warmup_fraction <= 1))
      throw input_error("--lr-warmup-fraction " + shortest(o.lr_warmup_fraction) + " is not a fraction; pass a number "
                        "from 0 to 1, e.g. 0.01");
    const long decay = given("--decay-steps") ? o.decay_steps : o.steps;
    o.warmup = std::lround(o.lr_warmup_fraction * double(decay));
  }
  // AdamW and initialisation
  for (const auto& [flag, v] : {std::pair<const char*, double>{"--adam-beta1", o.adam_beta1}, {"--adam-beta2", o.adam_beta2}})
    if (!(v >= 0 && v < 1))
      throw input_error(std::string(flag) + " " + shortest(v) + " is outside [0, 1); pass e.g. " +
                        (flag[11] == '1' ? "0.9" : "0.95"));
  if (!(o.adam_eps > 0 && std::isfinite(o.adam_eps)))
    throw input_error("--adam-eps " + shortest(o.adam_eps) + " must be a positive number; pass e.g. 1e-8");
  if (given("--init-method-std") && std::fabs(o.init_method_std - 0.02) > 1e-12)
    throw input_error("--init-method-std " + shortest(o.init_method_std) + ": loom initialises the weights with "
                      "standard deviation 0.02 (residual projections 0.02/sqrt(2 x layers), as Megatron's scaled "
                      "init), and another value is not supported yet; pass 0.02 or drop it");
  // PyTorch and GPU internals: accepted, with what loom does instead
  for (const auto& f : megatron_internals)
    if (given(f.flag)) o.notes.push_back(std::string("note: ") + f.flag + " changes nothing: " + f.note);
  if (given("--use-flash-attn") && o.attention != "fused")
    throw input_error("--use-flash-attn asks for the fused attention, but --attention " + o.attention +
                      " is given; pass one of them");
  if (given("--overlap-grad-reduce") && o.no_overlap)
    throw input_error("--overlap-grad-reduce and --no-overlap say different things; pass one of them");
}

/// --global-batch-size G without --layout auto: --grad-accum = G / (micro-batch x `dp`), the
/// micro-batch being --micro-batch or, when it is not given, the instance's `capacity`. Throws
/// loom::input_error when that does not divide or an explicit --grad-accum differs.
inline void derive_grad_accum(options& o, const CLI::App& app, int capacity, int dp) {
  if (app.count("--global-batch") == 0 || o.layout == "auto") return;
  const int micro = o.micro_batch > 0 ? o.micro_batch : capacity;
  const long per = long(micro) * std::max(dp, 1);
  const std::string what = "--global-batch-size " + std::to_string(o.global_batch) + " over micro-batch " +
                           std::to_string(micro) + (o.micro_batch > 0 ? "" : " (the capacity; --micro-batch-size not given)") +
                           " x data-parallel " + std::to_string(dp);
  if (o.global_batch % per != 0)
    throw loom::input_error(what + " is not a whole number of micro-batches per rank; pass a multiple of " +
                            std::to_string(per) + " (e.g. " + std::to_string(per * std::max(1L, o.global_batch / per)) +
                            "), or another --micro-batch-size");
  const int accum = int(o.global_batch / per);
  if (app.count("--grad-accum") > 0 && o.grad_accum != accum)
    throw loom::input_error(what + " is --grad-accum " + std::to_string(accum) + ", but --grad-accum " +
                            std::to_string(o.grad_accum) + " is given; pass one of them");
  o.grad_accum = accum;
}

/// The checks and defaults that follow parsing `app` into `o` (=: fills --warmup, --model and
/// --log-dir when they were not given: default_log_dir; `data_is_dataset`: --data names a
/// prepare_data dataset, whose default model is quickstart_bpe). Returns the --layout degrees
/// {TP, PP}. Reads nothing but the existence and kind of --resume, --checkpoint-dir and --out
/// and the names in a --resume directory. Throws loom::input_error naming the flag and the fix
/// for: a number that is not finite, --comm-timeout or --bucket-mb beyond the limits above, a
/// dropout outside [0, 1), a missing --resume, a --resume or --checkpoint-dir that is a file, a
/// --resume directory without checkpoints (check_checkpoint_paths), a --profile-steps window
/// outside the run, an --early-stop without periodic evaluations, an --out naming a directory, a
/// --layout that is malformed, does not divide the model or does not fit --ranks, a missing
/// --data, a dataset's PREFIX.json or PREFIX.model as --data, and a flag that would have no
/// effect: --save-every, --keep or --stop-at-step without a checkpoint directory, --stop-at-step
/// not before --steps. Adds a warning to o.notes for --loss-scale without fp16 and for the
/// sampling flags with --sample-tokens 0. Call apply_megatron_flags first. With --layout auto returns {0, 0}: main() chooses the layout, then calls this again.
/// Whether the combination is compiled is train_gpt's main() question (train::compiled_sessions()).
inline std::pair<int, int> check_flags(options& o, const CLI::App& app, bool data_is_dataset) {
  if (o.data.empty()) throw loom::input_error("--data is required: pass a UTF-8 text file or a prepare_data dataset");
  if (const auto ext = std::filesystem::path(o.data).extension(); ext == ".json" || ext == ".model") {
    const auto prefix = std::filesystem::path(o.data).replace_extension();
    std::error_code ec;
    if (std::filesystem::exists(prefix.string() + ".idx", ec) || std::filesystem::exists(prefix.string() + ".bin", ec))
      throw loom::input_error("--data '" + o.data + "' is the " + (ext == ".json" ? "JSON summary" : "tokenizer") +
                              " of the dataset '" + prefix.string() + "', not a text to train on; pass the dataset, "
                              "--data " + prefix.string());
  }
  if (app.count("--warmup") == 0 && app.count("--lr-warmup-fraction") == 0) o.warmup = std::min<long>(100, o.steps / 10);
  if (o.warmup > o.steps)
    throw loom::input_error("--warmup " + std::to_string(o.warmup) + " exceeds --steps " + std::to_string(o.steps) +
                            ": the learning rate would never leave its warm-up; pass --warmup <= " +
                            std::to_string(o.steps));
  if (app.count("--decay-steps") == 0) o.decay_steps = o.steps;
  if (o.warmup > o.decay_steps)
    throw loom::input_error("--warmup " + std::to_string(o.warmup) + " exceeds --decay-steps " +
                            std::to_string(o.decay_steps) + ": the decay would end before the warm-up; pass --decay-steps >= " +
                            std::to_string(o.warmup));
  if (app.count("--model") == 0 && data_is_dataset && loom::models::find_model(o.model)) o.model = "quickstart_bpe";
  if (app.count("--log-every") > 0) o.redraw = 0;  // asked for lines every N steps: keep each one
  if (app.count("--log-dir") == 0) o.log_dir = default_log_dir(o.out);
  using flag_value = std::pair<const char*, double>;
  for (const auto& [flag, v] : std::initializer_list<flag_value>{
           {"--lr", o.lr}, {"--min-lr", o.min_lr}, {"--weight-decay", o.weight_decay},
           {"--max-grad-norm", o.max_grad_norm}, {"--val-fraction", o.val_fraction}, {"--dropout", o.dropout},
           {"--temperature", o.temperature}, {"--time-budget", o.time_budget}, {"--peak-gflops", o.peak_gflops},
           {"--bucket-mb", o.bucket_mb}, {"--comm-timeout", o.comm_timeout}})
    if (!std::isfinite(v))
      throw loom::input_error(std::string(flag) + " " + std::to_string(v) + " is not a finite number; pass a decimal "
                              "number (see train_gpt --help)");
  for (const auto& [flag, v] : std::initializer_list<flag_value>{{"--max-grad-norm", o.max_grad_norm},
                                                                   {"--time-budget", o.time_budget}})
    if (v < 0)
      throw loom::input_error(std::string(flag) + " " + shortest(v) + " is negative; pass 0 (off) or a positive number");
  if (o.comm_timeout > max_comm_timeout_s)
    throw loom::input_error("--comm-timeout " + std::to_string(o.comm_timeout) + " s is beyond the " +
                            std::to_string(long(max_comm_timeout_s)) + " s limit; pass 0 to wait forever");
  if (o.bucket_mb > max_bucket_mb)
    throw loom::input_error("--bucket-mb " + std::to_string(o.bucket_mb) + " is beyond the " +
                            std::to_string(long(max_bucket_mb)) + " MiB limit; pass e.g. 1 (a layer never splits)");
  loom::check_dropout_probability(o.dropout, "--dropout");  // before any data is read
  std::error_code ec;  // the non-throwing forms: a name too long for the file system is just "not there"
  if (!o.resume.empty() && !std::filesystem::exists(o.resume, ec))  // before the model and data banner
    throw loom::input_error("--resume '" + o.resume + "' does not exist; pass the --checkpoint-dir of an earlier run "
                            "(e.g. out/ckpt) or one step_NNNNNNNN directory inside it");
  check_checkpoint_paths(o);
  if (const auto w = loom::io::step_window::parse(o.profile_steps); !w.empty() && w.first >= o.steps)
    throw loom::input_error("--profile-steps " + o.profile_steps + " starts after the run's last step (--steps " +
                            std::to_string(o.steps) + "): nothing would be recorded; choose a window inside 0:" +
                            std::to_string(o.steps));
  if (!(o.loss_scale > 0))
    throw loom::input_error("--loss-scale " + std::to_string(o.loss_scale) + " must be > 0 (the fp16 loss scaler's "
                            "first scale); pass e.g. --loss-scale 512");
  if (!(o.temperature > 0))  // checked before training, not after it
    throw loom::input_error("--temperature " + std::to_string(o.temperature) + " must be > 0; pass e.g. --temperature 0.8");
  if (o.top_k < 0)
    throw loom::input_error("--top-k " + std::to_string(o.top_k) + " is negative; pass 0 to sample from all tokens, or k >= 1");
  if (o.sample_tokens < 0)
    throw loom::input_error("--sample-tokens " + std::to_string(o.sample_tokens) + " is negative; pass 0 for no sample");
  if (!o.export_hf.empty() && std::filesystem::exists(o.export_hf, ec) && !std::filesystem::is_directory(o.export_hf, ec))
    throw loom::input_error("--export-hf '" + o.export_hf + "' is a file; the export is a directory (model.safetensors, "
                            "config.json): pass a directory name");
  if (o.early_stop > 0 && o.eval_every <= 0)
    throw loom::input_error("--early-stop " + std::to_string(o.early_stop) + " watches the periodic validation loss, "
                            "but --eval-every is 0 (no periodic evaluations); pass e.g. --eval-every 100");
  if (o.early_stop > 0 && o.eval_every >= o.steps)
    throw loom::input_error("--early-stop " + std::to_string(o.early_stop) + " watches the periodic validation loss, "
                            "but --eval-every " + std::to_string(o.eval_every) + " >= --steps " +
                            std::to_string(o.steps) + " leaves no evaluation before the end; pass --eval-every < " +
                            std::to_string(o.steps));
  if (!o.out.empty() && (o.out.back() == '/' || std::filesystem::is_directory(o.out, ec)))
    throw loom::input_error("--out '" + o.out + "' is a directory; the trained weights are one file: pass a file "
                            "name such as " + (std::filesystem::path(o.out) / "model.safetensors").string());
  if (!o.out.empty() && std::filesystem::is_regular_file(o.out, ec)) {  // never write weights over an input
    const std::filesystem::path out(o.out);
    bool input = !o.data.empty() && std::filesystem::equivalent(out, o.data, ec);
    for (const char* ext : {".bin", ".idx", ".json", ".model"})
      input = input || (!o.data.empty() && std::filesystem::equivalent(out, o.data + ext, ec));
    if (input || out.extension() != ".safetensors")
      throw loom::input_error("--out '" + o.out + "' " +
                              (input ? "is one of the run's --data files" : "exists and is not a .safetensors file") +
                              "; the trained weights would overwrite it: pass another file name, such as " +
                              (out.parent_path() / "model.safetensors").string());
  }
  if (o.device == "ascend" && o.precision == "fp32" && !o.allow_fp32_matmul)
    throw loom::input_error("--device ascend --precision fp32 runs every matmul in fp32 on the NPU's cube unit, a "
                            "fraction of its bf16/fp16 rate; pass --precision bf16, or --allow-fp32-matmul to choose "
                            "fp32 deliberately");
  if (o.allow_fp32_matmul && o.precision != "fp32")
    throw loom::input_error("--allow-fp32-matmul is for --precision fp32 (it opts into fp32 matmuls on the NPU); drop "
                            "it with --precision " + o.precision);
  if (o.device == "ascend" && o.dropout > 0)
    throw loom::input_error("--dropout " + shortest(o.dropout) + " with --device ascend: dropout runs on the CPU only so "
                            "far (loom has no NPU dropout kernels); pass --dropout 0, or --device cpu");
  if (o.comm == "hccl" && o.device != "ascend")
    throw loom::input_error("--comm hccl is the rank-table launch of NPUs; pass --device ascend, or --comm threads / mpi "
                            "on the CPU");
  if (o.comm == "hccl" && (o.ranks != 1 || o.npu >= 0))
    throw loom::input_error(std::string(o.ranks != 1 ? "--ranks" : "--npu") + " with --comm hccl: the rank table names "
                            "the ranks and each one's NPU; start one process per rank with RANK_TABLE_FILE and RANK_ID "
                            "set, and drop " + (o.ranks != 1 ? "--ranks" : "--npu"));
  if (o.device == "ascend" && o.npu >= 0 && o.comm == "threads" && o.ranks > 1)
    throw loom::input_error("--npu " + std::to_string(o.npu) + " with --ranks " + std::to_string(o.ranks) +
                            ": --npu puts this process on one NPU, but each of the ranks needs its own; drop --npu "
                            "(rank r takes NPU r)");
  if (o.device != "ascend" && (o.allow_fp32_matmul || o.npu >= 0 || o.no_device_timing))
    throw loom::input_error(std::string(o.npu >= 0 ? "--npu" : o.no_device_timing ? "--no-device-timing" : "--allow-fp32-matmul") +
                            " is for --device ascend; drop it or pass --device ascend");
  if (o.deterministic && o.device != "ascend")
    o.notes.push_back("note: --deterministic-mode changes nothing on the CPU: its kernels reduce in a fixed order, so a "
                      "run repeats bit for bit without it");
  if ((o.layout == "auto") != !o.memory_limit.empty())
    throw loom::input_error(o.memory_limit.empty() ? "--layout auto needs --memory-limit (bytes per rank, e.g. 24GiB)"
                                                   : "--memory-limit is for --layout auto; drop it or pass --layout auto");
  // flags that would have no effect in this combination: refused, or a warning
  const bool checkpoints = !o.checkpoint_dir.empty() || !o.resume.empty();
  for (const char* flag : {"--save-every", "--keep", "--stop-at-step", "--exit-on-save-failure", "--exit-signal-handler",
                           "--exit-interval"})
    if (app.count(flag) > 0 && !checkpoints && (std::string(flag) != "--stop-at-step" || o.stop_at_step > 0) &&
        (std::string(flag) != "--exit-interval" || o.exit_interval > 0))
      throw loom::input_error(std::string(flag) + " has no effect without --checkpoint-dir (--save): no checkpoint is "
                              "written; pass --checkpoint-dir DIR (e.g. out/ckpt), or drop " + flag);
  for (const auto& [flag, at] : {std::pair<std::string, long>{"--stop-at-step", o.stop_at_step},
                                  std::pair<std::string, long>{"--exit-interval", o.exit_interval}})
    if (at > 0 && at >= o.steps)
      throw loom::input_error(flag + " " + std::to_string(at) + " is not before --steps " + std::to_string(o.steps) +
                              ": the run ends first, and " + flag + " has no effect; pass " + flag + " < " +
                              std::to_string(o.steps) + ", or drop it");
  if (o.discard_newer_checkpoints && o.resume.empty())
    throw loom::input_error("--discard-newer-checkpoints has no effect without --resume: a new run never writes into "
                            "a directory that holds checkpoints; drop it, or pass --resume DIR");
  if (app.count("--loss-scale") > 0 && o.precision != "fp16")
    o.notes.push_back("warning: --loss-scale (--initial-loss-scale) " + shortest(o.loss_scale) + " has no effect with "
                      "--precision " + o.precision + ": only fp16 scales the loss");
  if (o.sample_tokens == 0)
    for (const char* flag : {"--temperature", "--top-k", "--prompt"})
      if (app.count(flag) > 0)
        o.notes.push_back(std::string("warning: ") + flag + " has no effect with --sample-tokens 0 (no sample)");
  if (o.layout == "auto") return {0, 0};  // train_gpt chooses it (train::choose_layout), then checks it here again
  const auto [tp, pp] = parse_layout(o.layout);
  const auto* m = loom::models::find_model(o.model);  // CLI11 checked the name
  if (const auto problem = m ? m->layout_problem(tp, pp) : std::string(); !problem.empty())
    throw loom::input_error(problem);  // the model first: a layout that cannot split it is the basic problem
  if (o.comm == "threads" && tp * pp > 1) check_world_size(tp, pp, o.ranks);  // before starting the ranks
  return {tp, pp};
}

}  // namespace train_gpt_cli
