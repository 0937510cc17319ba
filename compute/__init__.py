"""The shared runtime of orl's torch processes (the server, the trainer, the gate): how they compute
on this machine (`machine`: numerics, bf16 or fp32, and the sharing of cores). Below serving and
trainer; imports only schemas."""
