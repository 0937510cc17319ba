"""Pure rules that several components must apply alike, so they live below all of them: how far
top-K logprobs may go (`top_k`), the temperature logprobs are taken at (`sampling`), and the fold
of the promotion gate's decisions that the trainer and the server's follower both read
(`gate_decisions`). No I/O, no clock; imports only schemas."""
