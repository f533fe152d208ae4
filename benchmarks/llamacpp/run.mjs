// llama.cpp on CPU through node-llama-cpp's prebuilt binaries, for benchmarks/llamacpp.py.
//
//     node run.mjs MODEL.gguf [THREADS]     # THREADS: default the number of CPUs
//
// Reads one JSON request a line on stdin and writes one JSON reply a line on stdout (logs go to
// stderr). Token ids are fed as raw tokens: the caller tokenizes. Requests:
//
//   {"op": "info"}                                  versions, llama.cpp build, threads
//   {"op": "tokenize", "text": "..."}               {"ids": [...]} (no special tokens)
//   {"op": "logprobs", "ids": [...], "pass": k}     feed ids k a pass; {"logprobs": [...]}: for each
//                                                   i < len-1, log P(ids[i+1] | ids[..i]) in float64
//                                                   from the full logits row, and "argmax" of each row
//   {"op": "greedy", "ids": [...], "tokens": n}     n argmax tokens after ids (EOS not special)
//   {"op": "speed", "prompts": [[...], ...], "tokens": n}
//                                                   greedy, one sequence per prompt, all in one
//                                                   context, a step of all of them per batch;
//                                                   per-token times in seconds from the start
//   {"op": "quit"}
//
// A failed request answers {"error": "..."} and the process goes on.

import {readFileSync} from "node:fs";
import {createInterface} from "node:readline";
import {availableParallelism} from "node:os";
import {getLlama} from "node-llama-cpp";

const [modelPath, threadsArg] = process.argv.slice(2);
if (modelPath == null) {
    process.stderr.write("usage: node run.mjs MODEL.gguf [THREADS]\n");
    process.exit(2);
}
const threads = Number(threadsArg ?? availableParallelism());
const version = JSON.parse(readFileSync(new URL("./node_modules/node-llama-cpp/package.json", import.meta.url))).version;

// maxThreads 0: a context uses exactly its `threads`, not fewer when other evaluations run.
const llama = await getLlama({gpu: false, maxThreads: 0, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath, gpuLayers: 0});

// One context per (sequences, size) shape, kept: creating one costs a KV allocation.
const contexts = new Map();
async function sequencesOf(count, size) {
    const key = `${count}x${size}`;
    if (!contexts.has(key)) {
        const context = await model.createContext({
            sequences: count, contextSize: size, batchSize: Math.max(size, 8), threads,
        });
        contexts.set(key, {context, sequences: Array.from({length: count}, () => context.getSequence())});
    }
    const entry = contexts.get(key);
    for (const seq of entry.sequences)
        await seq.clearHistory();
    return entry;
}

function contextSizeFor(tokens) {
    return Math.max(256, Math.ceil((tokens + 1) / 256) * 256);
}

function logSoftmaxAt(logits, target) {
    // logits: Map token -> logit (the whole vocabulary); float64 as tests/backends/accuracy_kit.py
    let max = -Infinity, best = -1;
    for (const [token, value] of logits) {
        if (value > max || (value === max && token < best)) {
            max = value;
            best = token;
        }
    }
    let sum = 0;
    for (const value of logits.values())
        sum += Math.exp(value - max);
    const chosen = logits.get(target);
    if (chosen === undefined)
        throw new Error(`token ${target} not in the logits row (vocabulary ${logits.size})`);
    return [chosen - max - Math.log(sum), best];
}

async function logprobs({ids, pass}) {
    if (!(pass >= 1))
        throw new Error(`pass must be >= 1, got ${pass}`);
    const {sequences: [seq]} = await sequencesOf(1, contextSizeFor(Math.max(ids.length, pass)));
    const out = [], argmax = [];
    for (let a = 0; a < ids.length; a += pass) {
        const chunk = ids.slice(a, a + pass);
        const input = chunk.map((token, j) => (a + j < ids.length - 1 ? [token, {generateNext: {logits: true}}] : token));
        const results = await seq.controlledEvaluate(input);
        for (let j = 0; j < chunk.length && a + j < ids.length - 1; j++) {
            const [lp, best] = logSoftmaxAt(results[j].next.logits, ids[a + j + 1]);
            out.push(lp);
            argmax.push(best);
        }
    }
    return {logprobs: out, argmax};
}

async function greedy({ids, tokens}) {
    const {sequences: [seq]} = await sequencesOf(1, contextSizeFor(ids.length + tokens));
    const out = [];
    for await (const token of seq.evaluate(ids, {temperature: 0, yieldEogToken: true})) {
        out.push(token);
        if (out.length === tokens)
            break;
    }
    return {ids: out};
}

async function speed({prompts, tokens}) {
    const longest = Math.max(...prompts.map((p) => p.length));
    const {sequences} = await sequencesOf(prompts.length, contextSizeFor(longest + tokens));
    const start = performance.now();
    const runs = prompts.length === 1
        ? [await alone(sequences[0], prompts[0], tokens, start)]
        : await lockstep(sequences, prompts, tokens, start);
    return {runs, wall: (performance.now() - start) / 1000};
}

// One sequence: evaluate()'s own generation loop, as an application of llama.cpp would run it.
async function alone(seq, ids, tokens, start) {
    const stamps = [], out = [];
    for await (const token of seq.evaluate(ids, {temperature: 0, yieldEogToken: true})) {
        stamps.push((performance.now() - start) / 1000);
        out.push(token);
        if (out.length === tokens)
            break;
    }
    return {ids: out, stamps};
}

// Several sequences, one step of all of them a batch: every sequence queues its next token in the
// same tick, so node-llama-cpp decodes them in one llama_decode. (Each running its own evaluate()
// loop, they queue as their sampling finishes, the batches hold a few sequences each, and sampling
// runs beside the next decode: on 2 cores 8 sequences decoded 14 tok/s against 31 for one.)
async function lockstep(sequences, prompts, tokens, start) {
    const runs = prompts.map(() => ({ids: [], stamps: []}));
    let inputs = prompts;
    for (let step = 0; step < tokens; step++) {
        const results = await Promise.all(sequences.map((seq, i) => seq.controlledEvaluate(
            inputs[i].map((token, j) => (j === inputs[i].length - 1 ? [token, {generateNext: {token: true}}] : token))
        )));
        const now = (performance.now() - start) / 1000;
        inputs = results.map((result, i) => {
            const token = result[inputs[i].length - 1].next.token;
            runs[i].ids.push(token);
            runs[i].stamps.push(now);
            return [token];
        });
    }
    return runs;
}

function info() {
    return {
        node_llama_cpp: version,
        llama_cpp: llama.llamaCppRelease,
        build: llama.buildType,
        gpu: llama.gpu,
        threads,
        system_info: llama.systemInfo,
        vocabulary_type: model.vocabularyType,
        flash_attention: model.defaultContextFlashAttention,
        model: model.filename,
    };
}

const ops = {
    info,
    tokenize: ({text}) => ({ids: Array.from(model.tokenize(text, false))}),
    logprobs,
    greedy,
    speed,
};

const lines = createInterface({input: process.stdin, crlfDelay: Infinity});
for await (const line of lines) {
    if (line.trim() === "")
        continue;
    let reply;
    try {
        const request = JSON.parse(line);
        if (request.op === "quit")
            break;
        const op = ops[request.op];
        if (op == null)
            throw new Error(`unknown op ${JSON.stringify(request.op)}; one of ${Object.keys(ops).join(", ")}, quit`);
        reply = await op(request);
    } catch (error) {
        reply = {error: String(error?.stack ?? error)};
    }
    process.stdout.write(JSON.stringify(reply) + "\n");
}
for (const {context} of contexts.values())
    await context.dispose();
await model.dispose();
await llama.dispose();
