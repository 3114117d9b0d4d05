"""Diagnostic: compare prefill/decode logprobs of HF (fp32, bf16) and mini-sglang backends."""
import sys, torch, gc
sys.path.insert(0, ".")
from tests.conftest import build_tiny_model, make_req, qwen_tokenizer_dir
from transformers import AutoTokenizer
from mini_sglang.managers.scheduler import Scheduler
from mini_sglang.server_args import ServerArgs

tok = AutoTokenizer.from_pretrained(qwen_tokenizer_dir())
arch = sys.argv[1] if len(sys.argv) > 1 else "llama"
hf = build_tiny_model(arch, f"/tmp/diag_{arch}", tok, hidden_size=256, intermediate_size=512, head_dim=64)
prompt = list(range(100, 133))
ids = torch.tensor([prompt])
with torch.no_grad():
    ref32 = torch.log_softmax(hf(ids).logits[0].float(), -1)
    hfb = hf.to("cuda", torch.bfloat16)
    ref16 = torch.log_softmax(hfb(ids.cuda()).logits[0].float(), -1).cpu()
print("hf fp32 vs bf16 max diff (top5 of fp32):", float((ref32.gather(1, ref32.topk(5).indices) - ref16.gather(1, ref32.topk(5).indices)).abs().max()))
for backend, graphs in [("torch_native", False), ("flashinfer", False), ("flashinfer", True)]:
    args = ServerArgs(model_path=f"/tmp/diag_{arch}", device="cuda", dtype="bfloat16", max_total_tokens=4096,
                      max_running_requests=8, mem_fraction_static=0.85, cuda_graph_max_bs=4,
                      attention_backend=backend, disable_cuda_graph=not graphs, random_seed=0)
    outs = []
    s = Scheduler(args, send_to_detokenizer=outs.append)
    s.add_request(make_req("d", prompt, 8, True, return_logprob=True, logprob_start_len=0, top_logprobs_num=5))
    s.run_until_idle()
    vals, idxs, out_ids = [], [], []
    ovals, oidxs = [], []
    for m in outs:
        vals += m.input_top_logprobs_val[0]; idxs += m.input_top_logprobs_idx[0]
        ovals += m.output_top_logprobs_val[0]; oidxs += m.output_top_logprobs_idx[0]
        out_ids += m.output_ids[0]
    full = torch.tensor([prompt + out_ids])
    with torch.no_grad():
        r = torch.log_softmax(hfb(full.cuda()).logits[0].float(), -1).cpu()
    worst_in = max(float((torch.tensor(v) - r[k - 1, torch.tensor(i)]).abs().max()) for k, (v, i) in enumerate(zip(vals, idxs)) if v is not None)
    worst_out = [round(float((torch.tensor(v) - r[len(prompt) - 1 + k, torch.tensor(i)]).abs().max()), 4) for k, (v, i) in enumerate(zip(ovals, oidxs))]
    print(backend, "graphs" if graphs else "eager", "prefill worst", round(worst_in, 4), "decode per step", worst_out)
    del s; gc.collect(); torch.cuda.empty_cache()
