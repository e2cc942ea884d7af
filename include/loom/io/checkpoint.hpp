#pragma once
/// \file Training checkpoints (save, verify, resume), resharding of logical tensors, and
/// export/import of Hugging Face GPT-2 weights: this header includes them all. The long-form description, with the on-disk
/// layout and the multi-rank protocol, is docs/checkpoint.md.
///
/// On disk (one root directory per run, `--checkpoint-dir`):
///   <root>/latest                          text: the directory name of the newest complete
///                                          checkpoint, e.g. "step_00000300\n"
///   <root>/step_00000300/manifest.json     JSON: step, tokens, model, layout, precision,
///                                          optimizer, lr schedule, loss scaler, RNG and data
///                                          state, library version, every tensor's logical
///                                          shape and shard rule, every file's size and
///                                          XXH3-64, and a checksum of the manifest itself
///   <root>/step_00000300/model-tp00-pp00.safetensors
///                                          one file per model-parallel rank (tp, pp), written
///                                          by data-parallel rank 0: "param.<name>" in storage
///                                          precision, "master.<name>" (fp32, only when the
///                                          storage is narrower), "adam_m.<name>",
///                                          "adam_v.<name>" (master precision; not with
///                                          ZeRO-1); local shapes
///   <root>/step_00000300/optim-tp00-pp00-dp01.safetensors
///                                          ZeRO-1 only: data-parallel rank 1's AdamW moment
///                                          shard of model-parallel rank (tp 0, pp 0) and the
///                                          ranges of that rank's parameter buffer it holds
///   <root>/.tmp-step_00000400-<pid>/       a save in progress (or one a crash interrupted:
///                                          never read, removed by the next save)
///
/// A save is atomic: everything is written into the temporary directory, each file is fsynced,
/// read back and hashed, the manifest is written and fsynced, the directory is fsynced and
/// renamed into place (RENAME_EXCHANGE when a directory of the same step exists, so the old one
/// stays whole until the new one is in place), the root is fsynced, and only then `latest` is
/// replaced (temporary file, fsync, rename, fsync). A crash at any point leaves the previous
/// checkpoint intact and `latest` naming it (or the new one, once it is complete).
///
/// Resuming on the same layout, precision and thread count reproduces the uninterrupted run
/// bit for bit: parameters, AdamW moments and step count, the trainer's step (which the
/// learning-rate schedule reads), and whatever the caller's run_state carries (data position,
/// RNG state, tokens consumed) come back exactly.
///
/// Multi-rank runs (data parallel with or without ZeRO-1, train::trainer's
/// layout<TP,PP>) save collectively: save_checkpoint(ctx, root, tr, state, world) on every
/// rank; the save is complete only when every rank wrote and verified its files, otherwise no
/// rank moves `latest` and every rank throws naming the failed ranks. The manifest records the
/// layout (tp, pp, dp, zero) and every tensor's logical (global) shape and shard rule, so
/// load_checkpoint reshards a checkpoint onto any other layout of the same model with the pure
/// functions shard_tensor(gather_tensor(...)).
///
/// The code, by concern (each a header of its own; none is a template but the thin overloads
/// that take a trainer and ask it for its io::state_view):
///   checkpoint/state.hpp     what a trainer hands io: named tensors, shards, scalars
///   checkpoint/manifest.hpp  names, manifest fields, verify_checkpoint, find_checkpoint
///   checkpoint/reshard.hpp   shard_tensor, gather_tensor, reshard_tensor on nn::shard_geometry
///   checkpoint/commit.hpp    the commit protocol, single-rank and collective (io::collective)
///   checkpoint/save.hpp      snapshot and the blocking saves
///   checkpoint/async.hpp     async_saver / async_checkpointer (single- and multi-rank)
///   checkpoint/load.hpp      load_checkpoint, resume_checkpoint
///   hf_gpt2.hpp              export_gpt2, import_gpt2
#include <loom/io/checkpoint/async.hpp>
#include <loom/io/checkpoint/commit.hpp>
#include <loom/io/checkpoint/load.hpp>
#include <loom/io/checkpoint/manifest.hpp>
#include <loom/io/checkpoint/reshard.hpp>
#include <loom/io/checkpoint/save.hpp>
#include <loom/io/checkpoint/state.hpp>
#include <loom/io/hf_gpt2.hpp>
