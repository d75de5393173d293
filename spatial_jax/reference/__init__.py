"""Independent torch implementations of every reward, loss and kernel, used only to check parity."""
