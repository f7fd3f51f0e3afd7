"""What an exercise's check reads from a watched loop's facts (fastlab.loop_facts): one reading per technique,
each (verdict, words). True: the technique works in the loop, by its effect; False: missing or wrong, the words
naming what the watch saw and what to write, in the learner's terms; None: what could not be seen, said so, never
"found". fastlab.exercise's TECHNIQUES calls them."""

from __future__ import annotations

import math

SCHEDULE_TOLERANCE = 1e-4  # of the starting learning rate: a scheduler's recursive float arithmetic, not a schedule
SPAN = (-1, 0.25)  # a cosine's steps to its minimum, against the loop's optimiser steps n: from n - 1 to 1.25 n
SCALED_GRAD = 2.0  # a cross-entropy's gradient at the logits is at most 1 an element: above 2, the loss was scaled
STEP_CALL = "sched.step() once per optimiser step, after opt.step()"


def _cosine(lrs: list[float]) -> tuple[float, float] | None:
    """(steps to the minimum T, the minimum) of the cosine `lrs` follows from its first value (CosineAnnealingLR's
    lr0 -> eta_min over T steps), fitted on the first three and held at every step; None: not such a cosine."""
    d1, d2 = lrs[0] - lrs[1], lrs[0] - lrs[2]
    if d1 <= 0:
        return None
    c = d2 / (2 * d1) - 1  # (1 - cos 2t) / (1 - cos t) = 2 (1 + cos t), with t = pi / T
    if not -1 < c < 1:
        return None
    t, half = math.acos(c), d1 / (1 - c)  # half: (lr0 - eta_min) / 2
    formula = [lrs[0] - half * (1 - math.cos(t * k)) for k in range(len(lrs))]
    if any(abs(a - b) > SCHEDULE_TOLERANCE * lrs[0] for a, b in zip(lrs, formula)):
        return None
    low = lrs[0] - 2 * half
    return math.pi / t, 0.0 if abs(low) <= SCHEDULE_TOLERANCE * lrs[0] else low


def schedule_reading(f: dict) -> tuple[bool | None, str]:
    """Whether the loop's optimiser is AdamW with weight decay and its learning rate followed a cosine to its
    minimum over the loop's optimiser steps, stepped each step; and what the watch saw, in the learner's terms."""
    lrs, opt = f.get("lrs") or [], f["optimizer"]
    if opt is None:
        return None, "no optimiser step"
    said = f"{opt}(weight_decay={f['weight_decay']:g}{', fused=True' if f['fused'] else ''})"
    if opt != "AdamW":
        return False, f"{said}: swap it for torch.optim.AdamW (decoupled weight decay)"
    if not f["weight_decay"]:
        return False, f"{said}: with weight_decay=0 AdamW decays nothing; give it weight_decay=1e-2"
    n = len(lrs)
    if n < 3:
        return None, f"{said}, {n} optimiser step(s): too few to see a schedule"
    start = f"{said}, the learning rate {lrs[0]:.3g}"
    if max(lrs) - min(lrs) <= SCHEDULE_TOLERANCE * lrs[0]:
        built = "a scheduler was built but " if f["scheduled"] else "no scheduler: "
        return False, f"{start} at every one of {n} optimiser steps: {built}it did not move; call {STEP_CALL}"
    if lrs[1] > lrs[0]:
        return None, (f"{start} rising to {lrs[1]:.3g} at the next step (a warm-up?): the check matches a cosine from "
                      "the first step and cannot judge this schedule")
    fit = _cosine(lrs)
    if fit is None:
        return False, (f"{start} -> {lrs[1]:.3g} -> {lrs[2]:.3g}... does not follow a cosine (CosineAnnealingLR) "
                       f"stepped every step: use it, and call {STEP_CALL}")
    steps, low = fit
    if not n + SPAN[0] <= steps <= n * (1 + SPAN[1]):
        where = (f"reaches its minimum after {steps:.0f} steps and rises again" if steps < n else
                 f"spans {steps:.0f} steps, so it ends at {lrs[-1]:.3g}, far from its minimum")
        return False, (f"{start} follows a cosine that {where}, in a loop of {n} optimiser steps: T_max counts "
                       f"sched.step() calls; set it to the loop's optimiser steps (len(batches) here)")
    return True, f"{start} -> {lrs[-1]:.3g}, a cosine to {low:.3g} over {steps:.0f} steps, stepped each of {n} steps"


def autocast_reading(f: dict) -> tuple[bool | None, str]:
    """Whether the loop's forward ran under autocast to a 16-bit type, with backward and the optimiser step outside
    it, and with fp16 the loss scaled (a GradScaler) and the gradients unscaled before the step; and what the watch
    saw, in the learner's terms."""
    if not f["autocast"]:
        return False, "the forward in float32: no autocast reached the model's modules"
    said = f"the forward under autocast to {f['autocast']}"
    if f["backward_autocast"]:
        return False, f"{said}, and backward inside it too: end the `with torch.autocast(...)` block after the loss"
    if f["step_autocast"]:
        return False, f"{said}, and the optimiser step inside it too: end the autocast block after the loss"
    if f["autocast"] != "float16":
        return True, f"{said}, backward and the optimiser step outside it"
    if f["output_grad_max"] is None or f["optimizer"] is None:
        return None, f"{said}: no backward or optimiser step seen, so its gradient scaling could not be read"
    if f["output_grad_max"] <= SCALED_GRAD:
        return False, (f"{said} with no GradScaler: fp16 gradients underflow to zero unscaled; scaler = "
                       "torch.amp.GradScaler(device.type); scaler.scale(loss).backward(); scaler.step(opt); "
                       "scaler.update()")
    if f["unscaled_by"] is None:
        return None, f"{said}, the loss scaled: whether the step saw unscaled gradients could not be read"
    if f["unscaled_by"] < SCALED_GRAD:
        return False, (f"{said}, the loss scaled, but the optimiser stepped on the scaled gradients: call "
                       "scaler.step(opt) (it unscales them first) and scaler.update(), not opt.step()")
    return True, f"{said}, the loss scaled by a GradScaler and unscaled before the step, backward outside autocast"


def channels_last_reading(f: dict) -> tuple[bool | None, str]:
    """Whether every convolution of the first training forward got its input and its weights channels_last (NHWC);
    and what the watch saw, in the learner's terms."""
    n = f["convs"]
    if not n:
        return None, "no convolution in the training forward: channels_last has nothing to change"
    said = (f"{f['convs_input_nhwc']} of {n} convolutions got channels_last input, {f['convs_weights_nhwc']} "
            "channels_last weights")
    missing = []
    if f["convs_weights_nhwc"] < n:
        missing.append("model = model.to(device, memory_format=torch.channels_last)")
    if not f["first_conv_input_nhwc"]:
        missing.append("x = x.contiguous(memory_format=torch.channels_last), and use the x it returns: the batch "
                       "reaching the first convolution is NCHW")
    elif f["convs_input_nhwc"] < n:
        missing.append("keep the activations channels_last between the convolutions")
    return (False, f"{said}: " + "; ".join(missing)) if missing else (True, said)


def workers_reading(f: dict) -> tuple[bool | None, str]:
    """Whether the batches the loop trained on were made in DataLoader worker processes (and, for a GPU, pinned):
    read from the first batch that came through w(...), else from the batch reaching the model, by where its memory
    says it was made (fastlab.loop_facts.made_in), never from the loader's settings alone (a DataLoader built with
    workers but not iterated does nothing); and what the watch saw, in the learner's terms."""
    through = f.get("batch_from") is not None
    made = f["batch_from"] if through else f.get("input_from")
    where = "the first batch through w(...)" if through else "the batch reaching the model (none came through w(...))"
    workers = f.get("num_workers") if f.get("loader") == "dataloader" else None
    loader = (f"DataLoader(num_workers={workers}, pin_memory={f.get('pin_memory')})" if workers is not None else
              "a loader that is not a DataLoader (a generator or a list)")
    if made is None:
        return None, "no batch seen: where the loop's batches were made could not be read"
    if made == "device":
        return None, (f"{where} was already on {f['device']}: where it was made could not be read; wrap the "
                      "DataLoader itself, for x, y in w(loader), and copy the batch inside the step")
    if made == "main":
        stacked = f.get("batch_stacked") or 0
        collated = f" (collated from {stacked} images one by one as it was fetched)" if through and stacked > 1 else ""
        if not through and workers:
            return False, (f"{where} was made in the loop's own process, though the DataLoader the watch was given "
                           f"has num_workers={workers}: iterate that one, for x, y in w(loader)")
        return False, (f"{where} was made in the loop's own process, by {loader}{collated}: give the DataLoader the "
                       "loop iterates num_workers=2 (a DataLoader built but not iterated does nothing)")
    if made == "pinned" and not (through and workers):
        return None, (f"{where} was pinned by a DataLoader's pin_memory thread, but whether a worker process made it "
                      f"could not be read (it came through {loader})")
    said = (f"{where} was made in a DataLoader worker process" + (
        " and pinned by its pin_memory thread" if made == "pinned" else " (it arrived in shared memory)")
        + (f", by {loader}" if workers is not None else ""))
    if f["device"] == "cuda" and made != "pinned":
        return False, f"{said}, in pageable memory: pin_memory=device.type == 'cuda' lets its copy to the GPU overlap"
    return True, said + ("; non_blocking=True on the copies is not visible to the watch: not checked"
                         if f["device"] == "cuda" else " (pin_memory and non_blocking do nothing without a GPU)")


LR_RULE = 0.15  # of the square-root rule's rate: 4x the batch passes 1.7x-2.3x the learning rate; linear 4x does not


def batch_size_reading(f: dict, g: dict) -> tuple[bool | None, str]:
    """Whether the learner's loop trains on a larger batch than the given loop's with the learning rate scaled by
    the square root of the batch's factor (Adam): the rate it reached over every optimiser step (a warm-up starts
    low), against the given loop's; and what the watch saw, in the learner's terms."""
    n, n0 = f["images_per_step"], g["images_per_step"]
    lrs, lrs0 = f.get("lrs") or [], g.get("lrs") or []
    if not (n and n0 and lrs and lrs0):
        return None, "no optimiser step seen: the learning rate against the batch could not be read"
    k, steps = n / n0, f.get("steps") or 0
    if n <= n0:
        accumulated = (f", the optimiser stepped {len(lrs)} times in {steps} steps (accumulating gradients makes no "
                       f"batch larger: the model still runs {n} images at a time)" if len(lrs) < steps else "")
        return False, (f"{n} images a step, the given loop's {n0}{accumulated}: the batch did not grow; make "
                       "batch_size 4 * cfg.batch_size")
    top, top0, rule = max(lrs), max(lrs0), math.sqrt(k)
    ratio, want = top / top0, top0 * rule
    said = f"{n} images a step ({k:.2f}x the given {n0})"
    if len(lrs) > 1 and lrs[-1] > lrs[-2] * (1 + SCHEDULE_TOLERANCE) and ratio <= rule * (1 + LR_RULE):
        return None, (f"{said}, the learning rate still rising at the last of {len(lrs)} optimiser steps "
                      f"({lrs[0]:.3g} -> {lrs[-1]:.3g}, a warm-up?): the rate it warms up to was not reached, so it "
                      f"could not be held to the square-root rule's {rule:.2f}x ({want:.3g})")
    reached = next(i for i, lr in enumerate(lrs) if lr >= top * (1 - SCHEDULE_TOLERANCE))
    warm = f", warmed up from {lrs[0]:.3g} over {reached} optimiser steps" if reached else ""
    at = f"the learning rate {top:.3g}{warm}, {ratio:.2f}x the given {top0:.3g}"
    if abs(ratio / rule - 1) <= LR_RULE:
        return True, f"{said}, {at}: the square-root rule's {rule:.2f}x"
    how = ("left as given" if abs(ratio - 1) <= LR_RULE else "scaled linearly, SGD's rule"
           if abs(ratio / k - 1) <= LR_RULE else "lowered" if ratio < 1 else "raised too far" if ratio > rule
           else "raised too little")
    return False, (f"{said}, {at} ({how}): for Adam scale it by the square root of the batch's {k:.2f}x, lr = "
                   f"{top0:.3g} * {k:.3g} ** 0.5 = {want:.3g}")


def fused_in_memory_reading(f: dict) -> tuple[bool | None, str]:
    """Whether the optimiser that stepped is AdamW with fused=True in every parameter group, and the loop's first
    batch was indexed from tensors in memory: neither collated image by image as the watch fetched it (a
    DataLoader's collate, one torch.stack over its images) nor made in a DataLoader worker; and what the watch saw,
    in the learner's terms."""
    opt = f["optimizer"]
    if opt is None:
        return None, "no optimiser step seen"
    if opt != "AdamW":
        return False, (f"the optimiser that stepped is {opt}(fused={f['fused']}): keep torch.optim.AdamW "
                       "(fused=True makes it faster; another optimiser trains differently)")
    seen = ["AdamW(fused=True) in every parameter group" if f["fused"] else
            "the optimiser that stepped is AdamW(fused=False)"]
    missing = [] if f["fused"] else ["pass fused=True to the AdamW the loop steps"]
    stacked, images = f.get("batch_stacked") or 0, f.get("batch_images") or 0
    if f.get("batch_from") == "worker":
        seen.append("the first batch made in a DataLoader worker process")
    elif images > 1 and stacked >= images:
        seen.append(f"the first batch collated from {stacked} images one by one (torch.stack) as the watch fetched "
                    "it, as a DataLoader's collate does")
    elif f.get("batch_from") is not None:
        seen.append("the first batch indexed from tensors in memory")
    if len(seen) > 1 and not seen[-1].endswith("in memory"):
        missing.append("cut the batches from the whole set held in memory: images[i], labels[i] for i in "
                       "torch.randperm(n).split(batch_size)")
    said = ", ".join(seen)
    if missing:
        return False, f"{said}: " + "; ".join(missing)
    if len(seen) == 1:
        return None, f"{said}; no batch came through w(...): how the batches were made could not be read"
    return True, said


def export_reading(f: dict) -> tuple[bool | None, str]:
    """Whether one exported program (torch.export's GraphModule, built once before the loop) served every request,
    exported from the model in eval mode with its batch dimension dynamic; and what the watch saw, in the learner's
    terms."""
    if f["model"] is None:
        return None, "no module called in the first step"
    serve = "serve program.module(), where program = torch.export.export(model, (example,), dynamic_shapes=...)"
    if not f["graph_module"]:
        kind = (" (torch.compile compiles, it does not export)" if f["model"] == "OptimizedModule" else
                ", the eager module")
        return False, f"the requests were served by {f['model']}{kind}: {serve}"
    if f["exported_batch"] is None:
        return None, (f"the requests were served by a {f['model']} whose graph carries no input shapes: not a program "
                      "torch.export made, so the batches it accepts could not be read")
    later, missing = f["later_models"], []
    others = [m for m in later if m != f["model"]]
    if others:
        missing.append(f"at {len(others)} of the {len(later)} later requests the module called was {others[0]}: "
                       f"{serve} at every request")
    elif f["later_same_model"] < len(later):
        missing.append(f"a new program module at {len(later) - f['later_same_model']} of the {len(later)} later "
                       "requests: export (and call .module()) once, before the loop, and serve that one")
    if f["train_mode_ops"]:
        missing.append(f"exported from the model in train mode: {f['train_mode_ops']} batch norm(s) or dropout(s) run "
                       "as in training (each batch's statistics): call model.eval() before torch.export.export")
    if f["exported_batch"] != "dynamic":
        missing.append(f"exported for batches of {f['exported_batch']} only: a request of any other size (a ragged "
                       "last batch) fails; give dynamic_shapes=({0: torch.export.Dim('batch', min=1)},)")
    if missing:
        return False, "the first request served by an exported program, but " + "; ".join(missing)
    return True, (f"one exported program served every one of {1 + len(later)} requests, its batch dimension dynamic, "
                  "exported in eval mode")


def profiler_reading(f: dict) -> tuple[bool | None, str]:
    """Whether torch.profiler recorded some of the loop's steps and not the others, read at the end of every step:
    a schedule that prof.step() moved; and what the watch saw, in the learner's terms."""
    on = f.get("profiler_on") or []
    n, k = len(on), sum(on)
    if not n:
        return None, "no step ended"
    if not k:
        return False, (f"torch.profiler recorded none of {n} steps: it records once started (prof.start(), or with "
                       "profile(...) as prof:) and, with a schedule, once prof.step() has moved it past its wait and "
                       "warm-up steps (the schedule stays in its wait steps until prof.step() moves it); "
                       "record_function only labels a range for a profiler that is recording")
    if k == n:
        return False, (f"torch.profiler recording through every one of {n} steps: no schedule skipped or warmed up a "
                       "step (no schedule=..., or prof.step() never moved it): give it schedule=schedule(wait=1, "
                       "warmup=1, active=3) and call prof.step() once per step")
    steps = ", ".join(str(i + 1) for i, recording in enumerate(on) if recording)
    return True, f"torch.profiler recording at the end of steps {steps} of {n} and not the others: its schedule moved " \
                 "with prof.step()"


def ddp_reading(f: dict) -> tuple[bool | None, str]:
    """Whether the loop trained through DistributedDataParallel in a process group, backward all-reducing the
    gradients (counted in the first step, the wrapper and its sync seen at every later one), and destroyed the group
    after the loop; and what the watch saw, in the learner's terms."""
    wrap = "model = DistributedDataParallel(model), and call the wrapper, not its .module"
    if f["group"] is None:
        return False, f"no process group: dist.init_process_group(...) before the loop, then {wrap}"
    said = f"a process group ({f['group']})"
    if f["model"] != "DistributedDataParallel":
        return False, f"{said}, but the model called is {f['model']}: no gradient is all-reduced in backward; {wrap}"
    said += ", the model called through DistributedDataParallel"
    done = f["backward_collectives"]
    if done == 0 or f["ddp_sync"] is False:
        why = "its forward ran under model.no_sync(), so " if f["ddp_sync"] is False else ""
        return False, f"{said}, but {why}its backward all-reduced nothing: let backward sync the gradients at every step"
    if done is None:
        return None, (f"{said}: no backward and optimiser step seen, or the group keeps no count of its collectives, so "
                      "whether backward all-reduced the gradients could not be read")
    later = f["later_models"]
    others = [m for m in later if m != "DistributedDataParallel"]
    if others:
        return False, (f"{said} at the first step, but at {len(others)} of the {len(later)} later steps the model "
                       f"called was {others[0]}: {wrap}")
    if f["later_unsynced"]:
        return False, (f"{said}, but at {f['later_unsynced']} of the {len(later)} later steps under model.no_sync(): "
                       "their gradients were not all-reduced")
    said += f" at every one of {1 + len(later)} steps, its gradients all-reduced in backward ({done} collective(s))"
    if f.get("group_open"):
        return False, (f"{said}, but the process group was left open after the loop: call dist.destroy_process_group() "
                       "after it (the next run cannot start a group)")
    return True, f"{said}, the group destroyed after the loop"


def _named(labels: list[str], most: int = 3) -> str:
    """The first `most` of some pieces' labels, "..." where there are more."""
    return ", ".join(labels[:most]) + ("..." if len(labels) > most else "")


def no_grad_reading(f: dict) -> tuple[bool | None, str]:
    """Whether every evaluation forward the watch saw, in a step or between steps, recorded no graph, and every
    training step's graph was released two steps later (a running total that keeps `loss` holds them all); and what
    the watch saw, in the learner's terms."""
    n, graphs, held, checked = f["eval_forwards"], f["eval_with_grad"], f["graphs_held"], f["graphs_checked"]
    said = [f"{graphs} of {n} evaluation forwards recorded a graph" if graphs else
            f"{n} evaluation forwards recorded no graph",
            f"the graphs of {held} of {checked} training steps were still held two steps later" if held else
            f"no training step's graph was held two steps later ({checked} steps checked)"]
    missing = (["wrap the evaluation in `with torch.no_grad():`"] if graphs else []) + (
        ["a running total or a list keeps each step's loss with its graph: add loss.detach() (total_loss += "
         "loss.detach())"] if held else [])
    if missing:
        return False, f"{'; '.join(said)}: " + "; ".join(missing)
    if not n:
        return None, ("no evaluation forward (a model in eval mode, or run without grad or outside the steps) was "
                      f"seen, so torch.no_grad() could not be checked; {said[1]}")
    if not checked:
        return None, f"{said[0]}; fewer than 3 steps, so whether each step's graph is released could not be seen"
    return True, ", and ".join(said)


def paused_reading(f: dict) -> tuple[bool | None, str]:
    """Whether every evaluation forward the watch saw ran inside a `with w.paused()` block (off the clock), none
    between the steps on the clock or inside a step; and what the watch saw, in the learner's terms."""
    n, paused, in_step, blocks = f["eval_forwards"], f["eval_paused"], f["eval_in_step"], f["paused_blocks"]
    clock = n - paused - in_step
    if not n:
        return None, (f"no evaluation forward (outside the steps, or a model in eval mode or run without grad) was "
                      f"seen, {blocks} w.paused() block(s): nothing the watch could see to keep off the clock")
    missing = ([f"{clock} of {n} evaluation forwards ran on the clock between the steps ({paused} inside "
                "w.paused()): put `with w.paused():` around the evaluation inside the loop"] if clock else []) + (
        [f"{in_step} of {n} evaluation forwards ran inside a `with w.step(...)` block, timed as training: move the "
         "evaluation after the block, under `with w.paused():`"] if in_step else [])
    if missing:
        return False, "; ".join(missing)
    return True, f"all {n} evaluation forwards ran inside w.paused() ({blocks} block(s)), off the clock"


def checkpoint_reading(f: dict) -> tuple[bool | None, str]:
    """Whether every piece the first step called in training (each block; the last, the head, may stay) that saved
    activations ran again in backward instead, in more than one segment, and every parameter of the modules that ran
    got its gradient (a reentrant checkpoint on an input that needs no grad loses them); and what the watch saw, in
    the learner's terms."""
    names, again = f["pieces"], f["pieces_recomputed"]
    n, r = len(names), sum(again)
    if not n:
        return None, "no training forward in the first step: nothing to checkpoint"
    label = [f"#{i + 1} {name}" for i, name in enumerate(names)]
    said = f"{r} of {n} pieces ran again in backward"
    if f["params_without_grad"]:
        cut = [label[i] for i in range(n) if f["pieces_no_grad"][i] and not again[i]]
        why = (f"{_named(cut)} ran without a graph and never again in backward: a checkpoint(..., "
               "use_reentrant=True), the default where use_reentrant is not given, on an input that does not require "
               "grad loses its block's gradients; pass use_reentrant=False" if cut else
               "something cut them off the loss (a detach?)")
        return False, f"{said}; {f['params_without_grad']} of {f['params']} parameter tensors got no gradient: {why}"
    if not r:
        return False, (f"no piece's forward ran again in backward ({n} pieces called): nothing was checkpointed, "
                       "or a checkpoint's output went unused (the next block must take the h it returns)")
    kept = [label[i] for i in range(n - 1) if f["pieces_saved"][i] and not again[i]]
    if kept:
        return False, f"{said}; not checkpointed, their activations kept: {_named(kept)}: checkpoint every block"
    if r == 1:
        segment = label[again.index(True)]
        return False, (f"one checkpointed segment holding the whole forward ({segment}): backward recomputes all of "
                       "it at once, so its activations are all held again at the peak; checkpoint each block on its "
                       "own")
    if f["params"] is None:
        return None, f"{said}, but no optimiser step was seen, so whether every parameter got a gradient is not known"
    last = f" but the last, {label[-1]}" if f["pieces_saved"][-1] and not again[-1] else ""
    return True, f"{said}; the rest ({n - r}) keep no activations of their own{last}; every parameter got a gradient"
