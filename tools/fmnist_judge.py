#!/usr/bin/env python3
"""Scores class-conditional Fashion-MNIST samples with an independent classifier.

A small CNN is trained on the Fashion-MNIST training set (about 91-92% on the
test set) and then classifies every samples/class{c}_{i}.png: the share of
samples recognised as the class they were drawn for measures how well a
model follows its labels. This is a development check, not part of the
engine; it needs PyTorch (Debian's python3-torch) and Pillow.

    python3 tools/fmnist_judge.py train            # once: writes runs/judge.pt
    python3 tools/fmnist_judge.py score runs/demo/samples

Samples of 32x32 (padded) are centre-cropped to 28x28 before scoring.
"""
import argparse
import glob
import gzip
import os
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot"]


def load_idx(split):
    with gzip.open(f"{DATA}/{split}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(f"{DATA}/{split}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.tensor(x, dtype=torch.float32) / 127.5 - 1, torch.tensor(y, dtype=torch.long)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3, padding=1)
        self.c2 = nn.Conv2d(32, 64, 3, padding=1)
        self.c3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc = nn.Linear(128 * 3 * 3, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.c1(x)), 2)
        x = F.max_pool2d(F.relu(self.c2(x)), 2)
        x = F.max_pool2d(F.relu(self.c3(x)), 2)
        return self.fc(x.flatten(1))


def train(path, epochs):
    torch.manual_seed(0)
    x, y = load_idx("train")
    xt, yt = load_idx("t10k")
    net = Net()
    opt = torch.optim.Adam(net.parameters(), 1e-3)
    for ep in range(epochs):
        perm = torch.randperm(len(x))
        net.train()
        for i in range(0, len(x), 128):
            idx = perm[i:i + 128]
            loss = F.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
        acc = accuracy(net, xt, yt)
        print(f"epoch {ep + 1}: test accuracy {acc:.4f}", flush=True)
    torch.save(net.state_dict(), path)


@torch.no_grad()
def accuracy(net, x, y):
    net.eval()
    pred = torch.cat([net(x[i:i + 1000]).argmax(1) for i in range(0, len(x), 1000)])
    return (pred == y).float().mean().item()


def score(path, folder):
    from PIL import Image
    net = Net()
    net.load_state_dict(torch.load(path))
    files = sorted(glob.glob(os.path.join(folder, "class*.png")))
    if not files:
        sys.exit(f"no class*.png files in {folder}")
    imgs, labels = [], []
    for f in files:
        a = np.asarray(Image.open(f).convert("L"), dtype=np.float32)
        if a.shape[0] > 28:  # centre crop padded samples
            o = (a.shape[0] - 28) // 2
            a = a[o:o + 28, o:o + 28]
        imgs.append(a / 127.5 - 1)
        labels.append(int(re.search(r"class(\d+)[_-]", os.path.basename(f)).group(1)))
    x = torch.tensor(np.stack(imgs))[:, None]
    y = torch.tensor(labels)
    net.eval()
    with torch.no_grad():
        pred = net(x).argmax(1)
    for c in range(10):
        m = y == c
        if m.any():
            print(f"  {c} {CLASSES[c]:12s} {(pred[m] == c).float().mean().item():.2f}  ({int(m.sum())} samples)")
    print(f"recognised as their class: {(pred == y).float().mean().item():.4f} of {len(y)} samples")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["train", "score"])
    ap.add_argument("folder", nargs="?")
    ap.add_argument("--model", default="runs/judge.pt")
    ap.add_argument("--epochs", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(os.cpu_count())
    if a.command == "train":
        os.makedirs(os.path.dirname(a.model) or ".", exist_ok=True)
        train(a.model, a.epochs)
    else:
        if not a.folder:
            sys.exit("score needs the samples folder")
        score(a.model, a.folder)


if __name__ == "__main__":
    main()
