"""The shared runtime of orl's torch processes (the server, the trainer, the gate): how they compute
on this machine (`machine`: numerics and the sharing of cores) and the sampling rules the server
and the trainer must agree on (`sampling`). Below serving and trainer; imports only schemas."""
