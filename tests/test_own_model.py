"""Notebook 10's helpers: the demo Dataset, Dataset -> ImageSet, spawn safety, first steps and their advice."""

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset

import fastlab
from fastlab.lessons import own_model as om
from fastlab.models import TinyNet
from fastlab.profiles import PROFILES


class ListDataset(Dataset):
    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def test_stripes_dataset_is_deterministic_labelled_and_synthetic():
    a, b = om.StripesDataset(50, "train"), om.StripesDataset(50, "train")
    x, y = a[7]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and 0 <= float(x.min()) and float(x.max()) <= 1
    assert torch.equal(x, b[7][0]) and y == b[7][1]
    assert not torch.equal(x, om.StripesDataset(50, "held_out")[7][0])
    assert len({a[i][1] for i in range(50)}) > 5 and a.synthetic
    with pytest.raises(ValueError, match="split='test'"):
        om.StripesDataset(5, "test")
    with pytest.raises(IndexError):
        a[50]


def test_to_imageset_converts_each_image_kind_exactly():
    from PIL import Image

    base = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    items = [
        (torch.from_numpy(base).permute(2, 0, 1).contiguous(), 1),  # uint8 CxHxW tensor
        (torch.from_numpy(base).permute(2, 0, 1).float() / 255, torch.tensor(2)),  # ToTensor's output
        (base.copy(), np.int64(3)),  # HxWxC array
        (Image.fromarray(base), 4),  # PIL
    ]
    images = om.to_imageset(ListDataset(items), ListDataset(items[:1]), name="mine")
    assert images.train_images.shape == (4, 32, 32, 3) and images.train_images.dtype == np.uint8
    for i in range(4):
        assert np.array_equal(images.train_images[i], base)
    assert images.train_labels.tolist() == [1, 2, 3, 4] and images.name == "mine" and not images.synthetic
    stripes = om.to_imageset(om.StripesDataset(8), om.StripesDataset(4, "held_out"))
    assert stripes.synthetic and "SYNTHETIC" in stripes.describe()


@pytest.mark.parametrize("item, match", [
    ((torch.zeros(1, 28, 28), 0), r"train\[0\]: an image of shape \(1, 28, 28\).*Resize"),
    ((torch.full((3, 32, 32), -1.5), 0), "from -1.5 to -1.5.*Remove Normalize"),
    ((torch.zeros(3, 32, 32), 1.0), r"train\[0\]: label 1.0"),
    ((torch.zeros(3, 32, 32), -2), "label -2"),
    ("not an image", "must yield"),
    (("text", 0), "an image of type str"),
])
def test_to_imageset_names_what_is_wrong(item, match):
    with pytest.raises(ValueError, match=match):
        om.to_imageset(ListDataset([item]), ListDataset([(torch.zeros(3, 32, 32), 0)]))


def test_to_imageset_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match=r"over max_mb=0.001"):
        om.to_imageset(om.StripesDataset(10), om.StripesDataset(10, "held_out"), max_mb=0.001)
    with pytest.raises(ValueError, match="max_mb=0 is not allowed"):
        om.to_imageset(om.StripesDataset(1), om.StripesDataset(1), max_mb=0)
    with pytest.raises(ValueError, match="held_out=int is not allowed"):
        om.to_imageset(om.StripesDataset(1), 5)


def test_an_imageset_from_a_dataset_trains_with_the_device_loader(quick):
    images = om.to_imageset(*om.demo_datasets(quick))
    r = fastlab.run(quick.replace(loader="device"), dataset=images, progress=False)
    assert r.ok and r.synthetic and r.dataset["train_images"] == quick.train_images


def test_spawn_safety_tells_module_classes_from_notebook_ones():
    safe, why = om.spawn_safety(om.StripesDataset(3))
    assert safe and "fastlab.lessons.own_model.StripesDataset" in why

    class Local(om.StripesDataset):
        pass

    assert not om.spawn_safety(Local(3))[0] and "inside a function" in om.spawn_safety(Local(3))[1]
    Local.__module__, Local.__qualname__ = "__main__", "Local"
    safe, why = om.spawn_safety(Local(3))
    assert not safe and "__main__" in why and "num_workers=0" in why
    with_lambda = om.StripesDataset(3)
    with_lambda.transform = lambda x: x
    safe, why = om.spawn_safety(with_lambda)
    assert not safe and "cannot be pickled" in why


def test_a_module_passed_as_model_restarts_from_the_same_weights():
    net = TinyNet()
    build = om._builder(net)
    first, second = build(), build()
    assert first is not net and first is not second
    with torch.no_grad():
        next(first.parameters()).add_(1.0)  # "training" one copy must not move the next
    assert torch.equal(next(second.parameters()), next(net.parameters()))
    assert torch.equal(next(build().parameters()), next(net.parameters()))
    with pytest.raises(ValueError, match="model=int is not allowed"):
        om._builder(3)


def test_first_steps_runs_each_technique_alone_on_top_of_the_baseline(quick):
    results = om.first_steps(quick, model=TinyNet, dataset=om.demo_datasets(quick), progress=False)
    names = [r.extras["technique"] for r in results]
    assert names[0] == "baseline" and "channels_last" in names and "device-resident loader" in names
    by = {r.extras["technique"]: r for r in results}
    assert by["device-resident loader"].config["loader"] == "device"
    assert by["channels_last"].config["channels_last"] and by["channels_last"].config["loader"] == "dataloader"
    assert all(r.synthetic for r in results)
    assert "mixed precision" in results[0].extras["skipped_techniques"]  # no CUDA here
    tried, skipped, images = om.candidates(quick, om.demo_datasets(quick), max_mb=0.001)
    assert images is None and "over max_mb" in skipped["device-resident loader"] and "channels_last" in tried
    with pytest.raises(ValueError, match="dataset=list is not allowed"):
        om.first_steps(quick, model=TinyNet, dataset=[1, 2, 3])


def fake(label, speeds, wait=0.0, status="ok", technique=None):
    r = fastlab.RunResult(config={"warmup_steps": 0}, label=label, status=status, window_throughput=list(speeds),
                          step_seconds=[1.0] * 4, data_wait_seconds=[wait] * 4)
    r.extras["technique"] = technique or label
    return r


def test_advice_is_ordered_by_what_was_measured():
    base = fake("baseline", [100, 100, 100], wait=0.5)
    base.extras["skipped_techniques"] = {"mixed precision": "no GPU"}
    results = [base, fake("small gain", [120, 120, 120]), fake("noise", [101, 95, 104]),
               fake("big gain", [300, 300, 300]), fake("slower", [60, 60, 60]),
               fake("limited", [], status="time_limited")]
    lines = om.advice(results)
    assert [line.split(". ", 1)[0] for line in lines] == [str(i) for i in range(1, len(lines) + 1)]
    order = [line.split(". ", 1)[1].split(":")[0] for line in lines]
    assert order == ["big gain", "small gain", "noise", "slower", "limited", "mixed precision", "Then stack the ones "
                     "that paid and measure the stack (notebook 09)"]
    assert "no verdict: 'limited' finished no timed window" in lines[4] and "larger max_seconds" in lines[4]
    # the baseline's own data wall is the advisor's finding, printed beside this list in notebook 10
    assert [f.key for f in fastlab.advise(base)][:1] == ["data_bound"]
    quiet = om.advice([fake("baseline", [100] * 3), fake("slower", [50] * 3)])
    assert len(quiet) == 1 and "slower here" in quiet[0]  # no stacking advice without a gain
    assert "data_bound" not in [f.key for f in fastlab.advise(fake("baseline", [100] * 3))]  # no data wait
    # a technique whose run diverged is not credited its speed, however fast its windows read
    blew_up = om.advice([fake("baseline", [100] * 3), fake("fp16", [300] * 3, status="diverged")])
    assert len(blew_up) == 1 and "fp16: no verdict: 'fp16' diverged" in blew_up[0] and "try it first" not in blew_up[0]


def test_notebook_config_shortens_only_the_smoke_profile():
    cfg, note = om.notebook_config("smoke")
    assert (cfg.steps, cfg.warmup_steps, cfg.windows) == (12, 2, 3) and "shortened" in note
    cpu, note = om.notebook_config("cpu", batch_size=16)
    assert cpu.steps == fastlab.config_for("cpu").steps and cpu.batch_size == 16 and "its own sizes" in note


def test_the_loop_dataset_holds_exactly_the_loop_steps():
    cfg, _ = om.notebook_config("smoke")
    assert len(om.loop_dataset(cfg)) == cfg.batch_size * PROFILES["smoke"].loop_steps


def _gpu_profile_small():
    """The gpu profile's shapes (ResNet-18, the device loader) at smoke's sizes, on this CPU."""
    return fastlab.config_for("gpu", device="cpu").replace(steps=2, warmup_steps=1, windows=1, train_images=64,
                                                           eval_images=32, batch_size=16)


def test_first_steps_switch_the_gpu_profiles_device_loader_for_the_readers_datasets(capsys):
    """10 under the gpu profile (issue 53): the reader's Datasets need the DataLoader; the device loader, which needs
    an ImageSet, is switched once, said in one line, and then tried as a technique on the converted images."""
    base = _gpu_profile_small()
    assert base.loader == "device"
    results = om.first_steps(base, model=TinyNet, dataset=om.demo_datasets(base), progress=False)
    said = [line for line in capsys.readouterr().out.splitlines() if "switched" in line]
    assert len(said) == 1 and "loader='dataloader'" in said[0] and "ImageSet" in said[0]
    by = {r.extras["technique"]: r for r in results}
    assert by["baseline"].ok and by["baseline"].config["loader"] == "dataloader"
    assert by["device-resident loader"].config["loader"] == "device"
    cfg, note = om.notebook_config("gpu")
    assert cfg.loader == "dataloader" and "switched" in note and "\n" not in note
    assert om.notebook_config("smoke")[0].loader == fastlab.config_for("smoke").loader  # nothing to switch there
