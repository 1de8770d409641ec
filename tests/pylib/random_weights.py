"""Random weights for the generated test models, so that parity tests compare something other
than a fresh model's initialization (zero biases, unit norms, identical layers)."""
import torch


def randomize(model, seed):
    """Matrices become N(0, 0.15²); 1-D parameters move by N(0, 0.1²) from their initial values,
    so norm scales stay around 1 and biases around 0. Returns the model in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if p.dim() >= 2:
                p.copy_(noise * 0.15)
            else:
                p.add_(noise * 0.1)
    return model.eval()
