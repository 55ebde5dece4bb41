"""A small real PyTorch Lightning job for the demo: a linear model fitted by full-batch SGD,
one step per epoch, a ``ModelCheckpoint`` after every epoch (``epoch=E-step=S.ckpt``).

Run with the framework virtualenv's Python (tools/bootstrap makes /opt/jobwrap/frameworks).
It resumes with Lightning's own ``ckpt_path`` from ``JOBWRAP_RESUME_FROM`` when jobwrap
exports it. ``KILL_AT=E`` makes the first attempt SIGKILL itself as epoch E starts (a node
or the OOM killer taking the process). The last line is the final weights' SHA-256: an
uninterrupted run and a killed-and-resumed one print the same.
"""

import hashlib
import os
import signal
import sys


def main() -> None:
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    import torch
    from lightning.pytorch import LightningModule, Trainer, seed_everything
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    seed_everything(7, verbose=False)
    ckdir = os.environ["JOBWRAP_CHECKPOINT_DIR"]
    attempt = os.environ.get("JOBWRAP_ATTEMPT", "0")
    resume = os.environ.get("JOBWRAP_RESUME_FROM")
    kill_at = int(os.environ.get("KILL_AT", "0"))

    inputs = torch.linspace(-1, 1, 64).reshape(64, 1).repeat(1, 4)
    targets = inputs @ torch.tensor([[0.5], [-1.0], [2.0], [0.25]]) + 0.1
    data = DataLoader(TensorDataset(inputs, targets), batch_size=64)

    class Regression(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch, _index):  # type: ignore[no-untyped-def]
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            print(f"attempt={attempt} epoch={self.current_epoch} loss={loss.item():.6f}",
                  flush=True)
            return loss

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class KillOnce(Callback):
        def on_train_epoch_start(self, trainer, module):  # type: ignore[no-untyped-def]
            if kill_at and attempt == "0" and trainer.current_epoch == kill_at:
                print(f"attempt 0: SIGKILL at the start of epoch {kill_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

    model = Regression()
    trainer = Trainer(max_epochs=epochs, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[KillOnce(), ModelCheckpoint(dirpath=ckdir, save_top_k=-1,
                                                             every_n_epochs=1)])
    print(f"attempt={attempt} resume_from={resume or 'none'}", flush=True)
    trainer.fit(model, data, ckpt_path=resume or None)
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + tensor.detach().numpy().tobytes())
    print(f"done epochs={epochs} weights={digest.hexdigest()[:16]}", flush=True)


if __name__ == "__main__":
    main()
