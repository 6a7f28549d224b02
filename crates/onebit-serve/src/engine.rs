//! The engine thread: it owns the model and, each step, runs one batched
//! forward over every active sequence (a chunk of prompt for those still
//! prefilling, one token for those decoding), then samples each sequence's
//! next token. Since `forward_batch` gives each sequence exactly the logits it
//! would get alone, a greedy request gets the same tokens however many others
//! share its steps.
//!
//! Requests wait in a bounded queue and are admitted as slots free. A
//! sequence whose client went away (its event receiver dropped) or that the
//! server cancelled (a stop string) is freed before the next step.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use onebit_model::sampler::{bias_logits, repeat_penalize, Sampler, SamplerConfig};
use onebit_model::spec::{SpecPlan, Speculator};
use onebit_model::{Logits, Model, SeqInput, SeqState};
use tokio::sync::mpsc::UnboundedSender;

use crate::cache::{rewindable, PrefixCache};
use crate::constrain::Constraint;
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct GenParams {
    /// Tokens to generate at most (already capped by the context).
    pub max_new: usize,
    pub sampler: SamplerConfig,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// `repeat_penalty` (1: off) over the last `repeat_last_n` tokens of
    /// prompt and reply (`None`: all of them).
    pub repeat_penalty: f32,
    pub repeat_last_n: Option<usize>,
    /// Some(k): report the chosen token's logprob and the k most likely.
    pub logprobs: Option<usize>,
    /// Draft tokens ahead when the engine has a drafter (off for sequences
    /// with penalties or logprobs, whose per-token logits it does not keep).
    pub speculative: bool,
    /// `logit_bias`: (token id, bias), ids within the vocabulary.
    pub logit_bias: Vec<(u32, f32)>,
}

/// One sequence to generate: one choice of one request.
pub struct Job {
    pub prompt: Arc<Vec<u32>>,
    pub params: GenParams,
    /// The choice index within its request.
    pub index: usize,
    pub tx: UnboundedSender<Event>,
    /// Set by the request's handler to end the sequence (a stop string).
    pub cancel: Arc<AtomicBool>,
    pub submitted: Instant,
    /// The grammar the output must follow (response_format, a forced call).
    pub constraint: Option<Constraint>,
}

#[derive(Clone, Debug)]
pub struct TokenLogprob {
    pub logprob: f32,
    /// The most likely tokens, most likely first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    Stop,
    Length,
    /// The output constraint failed mid-decode (checked grammars rarely do):
    /// the choice ends with what it has, `finish_reason` "constraint_error".
    Constraint,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length => "length",
            Finish::Constraint => "constraint_error",
        }
    }
}

#[derive(Debug)]
pub enum Event {
    /// Admitted: `cached` prompt tokens came from the prefix cache.
    Started {
        index: usize,
        cached: usize,
    },
    Token {
        index: usize,
        id: u32,
        logprob: Option<TokenLogprob>,
    },
    Done {
        index: usize,
        finish: Finish,
    },
    Failed {
        index: usize,
        message: String,
    },
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Sequences waiting at most; beyond, submissions are refused.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step, over all sequences.
    pub prefill_chunk: usize,
    pub prefix_cache: bool,
    /// Bytes the prefix cache may hold; None: [`default_cache_bytes`] of
    /// the model.
    pub cache_bytes: Option<usize>,
    /// Speculative decoding for the sequences that ask for it.
    pub spec: Option<Arc<SpecPlan>>,
}

pub struct QueueFull;

/// The prefix cache's default budget: the state of one sequence at the
/// model's full context (its KV rows at every position plus any fixed
/// recurrent state), at most 1 GiB. Tied to the model and the context, so a
/// small model does not hold a gigabyte of old prefixes: SmolLM2-135M at
/// 8,192 positions of f16 KV gets 189 MB, where a fixed 1 GiB let a soak of
/// distinct prompts grow the server from 126 MB to 1.5 GB of RSS (issue 31).
pub fn default_cache_bytes(model: &Model) -> usize {
    model.new_state().bytes_at(model.max_context()).min(1 << 30)
}

/// Work that needs the model but is not a sequence to decode (an embedding
/// request): run on the engine thread between two steps.
pub type Task = Box<dyn FnOnce(&Model) + Send>;

struct Queue {
    waiting: VecDeque<Job>,
    tasks: VecDeque<Task>,
    shutdown: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    max_queue: usize,
    metrics: Arc<Metrics>,
}

/// The handle the HTTP side holds.
pub struct Engine {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    pub fn start(
        model: Model,
        stops: Vec<u32>,
        cfg: EngineConfig,
        metrics: Arc<Metrics>,
    ) -> Engine {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                waiting: VecDeque::new(),
                tasks: VecDeque::new(),
                shutdown: false,
            }),
            wake: Condvar::new(),
            max_queue: cfg.max_queue,
            metrics,
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("onebit-engine".into())
            .spawn(move || Worker::new(model, stops, cfg, s).run())
            .expect("spawn the engine thread");
        Engine {
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues all of a request's sequences, or none when they do not fit.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), QueueFull> {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.waiting.len() + jobs.len() > self.shared.max_queue {
            // Sequences whose clients hung up while waiting hold no slot.
            let before = q.waiting.len();
            q.waiting
                .retain(|j| !j.tx.is_closed() && !j.cancel.load(Ordering::Relaxed));
            Metrics::add(
                &self.shared.metrics.sequences_cancelled,
                (before - q.waiting.len()) as u64,
            );
        }
        if q.shutdown || q.waiting.len() + jobs.len() > self.shared.max_queue {
            return Err(QueueFull);
        }
        q.waiting.extend(jobs);
        self.shared
            .metrics
            .queue_depth
            .store(q.waiting.len() as u64, Ordering::Relaxed);
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Queues `task` to run on the engine thread before its next step, within
    /// the same queue bound as sequences.
    pub fn run_task(&self, task: Task) -> Result<(), QueueFull> {
        let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if q.shutdown || q.waiting.len() + q.tasks.len() >= self.shared.max_queue {
            return Err(QueueFull);
        }
        q.tasks.push_back(task);
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// False once the engine thread has ended (after shutdown, or a panic).
    pub fn alive(&self) -> bool {
        self.thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|t| !t.is_finished())
    }

    /// Refuses new work, lets the active and queued sequences finish (their
    /// clients are still connected), and joins the thread.
    pub fn shutdown(&self) {
        {
            let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            q.shutdown = true;
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }
}

struct Seq {
    job: Job,
    state: SeqState,
    /// The tokens whose positions `state` holds.
    fed: Vec<u32>,
    /// Tokens still to run: the rest of the prompt, then the last sampled token.
    pending: Vec<u32>,
    sampler: Sampler,
    generated: usize,
    counts: HashMap<u32, u32>,
    first_token: Option<Instant>,
    /// For recurrent models: the state at prompt minus one token was cached.
    snapshotted: bool,
    done: bool,
    /// Speculative decoding: its drafter, and whether this step verifies a draft.
    spec: Option<Speculator>,
    verifying: bool,
}

struct Worker {
    model: Model,
    stops: Vec<u32>,
    cfg: EngineConfig,
    shared: Arc<Shared>,
    cache: Option<PrefixCache>,
    rewindable: bool,
}

impl Worker {
    fn new(model: Model, stops: Vec<u32>, cfg: EngineConfig, shared: Arc<Shared>) -> Worker {
        let rewindable = rewindable(&model.new_state());
        let cache = cfg.prefix_cache.then(|| {
            PrefixCache::new(
                cfg.cache_bytes
                    .unwrap_or_else(|| default_cache_bytes(&model)),
            )
        });
        shared.metrics.kv_capacity.store(
            (cfg.max_seqs * model.max_context()) as u64,
            Ordering::Relaxed,
        );
        Worker {
            model,
            stops,
            cfg,
            shared,
            cache,
            rewindable,
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The gauges a scheduler reads: running sequences and their KV positions.
    fn publish(&self, active: &[Seq]) {
        let m = self.metrics();
        m.active_sequences
            .store(active.len() as u64, Ordering::Relaxed);
        m.kv_positions.store(
            active.iter().map(|s| s.fed.len() as u64).sum(),
            Ordering::Relaxed,
        );
    }

    fn run(mut self) {
        let mut active: Vec<Seq> = Vec::new();
        loop {
            let (admitted, tasks): (Vec<Job>, Vec<Task>) = {
                let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
                while q.waiting.is_empty() && q.tasks.is_empty() && active.is_empty() && !q.shutdown
                {
                    q = self.shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                let tasks: Vec<Task> = q.tasks.drain(..).collect();
                if q.shutdown && q.waiting.is_empty() && active.is_empty() && tasks.is_empty() {
                    return;
                }
                let room = self.cfg.max_seqs.saturating_sub(active.len());
                let n = room.min(q.waiting.len());
                let jobs = q.waiting.drain(..n).collect();
                self.metrics()
                    .queue_depth
                    .store(q.waiting.len() as u64, Ordering::Relaxed);
                (jobs, tasks)
            };
            for task in tasks {
                task(&self.model);
            }
            for job in admitted {
                if let Some(s) = self.admit(job) {
                    active.push(s);
                }
            }
            // Free what clients no longer want.
            for s in active.iter_mut() {
                if s.job.tx.is_closed() || s.job.cancel.load(Ordering::Relaxed) {
                    Metrics::add(&self.metrics().sequences_cancelled, 1);
                    s.done = true;
                }
            }
            self.retire_done(&mut active);
            self.publish(&active);
            if active.is_empty() {
                continue;
            }
            self.step(&mut active);
            self.retire_done(&mut active);
            self.publish(&active);
        }
    }

    fn admit(&mut self, job: Job) -> Option<Seq> {
        if job.tx.is_closed() || job.cancel.load(Ordering::Relaxed) {
            Metrics::add(&self.metrics().sequences_cancelled, 1);
            return None;
        }
        let prompt = job.prompt.clone();
        let (state, cached) = self
            .cache
            .as_mut()
            .and_then(|c| c.lookup(&prompt))
            .unwrap_or_else(|| (self.model.new_state(), 0));
        Metrics::add(&self.metrics().prompt_tokens, prompt.len() as u64);
        Metrics::add(&self.metrics().cached_prompt_tokens, cached as u64);
        let _ = job.tx.send(Event::Started {
            index: job.index,
            cached,
        });
        let sampler = Sampler::new(job.params.sampler.clone());
        let p = &job.params;
        // The verify step samples from the raw logits: a sequence whose
        // logits are changed first (penalties, bias, a grammar) or reported
        // (logprobs) decodes plainly.
        let plain = p.presence_penalty != 0.0
            || p.frequency_penalty != 0.0
            || p.repeat_penalty != 1.0
            || p.logprobs.is_some()
            || !p.logit_bias.is_empty()
            || job.constraint.is_some();
        let spec = match (&self.cfg.spec, p.speculative && !plain) {
            (Some(plan), true) => match plan.speculator(self.model.sem.dims.n_vocab, &p.sampler) {
                Ok(sp) => Some(sp),
                Err(e) => {
                    let _ = job.tx.send(Event::Failed {
                        index: job.index,
                        message: format!("cannot start drafting: {e}"),
                    });
                    return None;
                }
            },
            _ => None,
        };
        Some(Seq {
            spec,
            verifying: false,
            state,
            fed: prompt[..cached].to_vec(),
            pending: prompt[cached..].to_vec(),
            sampler,
            generated: 0,
            counts: HashMap::new(),
            first_token: None,
            snapshotted: self.rewindable || cached + 1 >= prompt.len(),
            done: false,
            job,
        })
    }

    /// One batched forward and the sampling that follows it.
    fn step(&mut self, active: &mut [Seq]) {
        // How many pending tokens each sequence runs this step.
        let mut budget = self.cfg.prefill_chunk.max(1);
        let mut takes = vec![0usize; active.len()];
        // Decoding sequences run their last sampled token every step; the
        // prefill budget goes to the prompts with the least left first, so
        // a short request is not held behind a long prompt's whole prefill
        // (the long one still gets the rest of every step's budget).
        let mut order: Vec<usize> = (0..active.len()).collect();
        order.sort_by_key(|&i| (active[i].generated == 0, active[i].pending.len()));
        for i in order {
            let s = &mut active[i];
            if s.generated > 0 {
                // Decoding: the last sampled token, and any draft after it.
                takes[i] = 1;
                s.verifying = false;
                if let Some(sp) = &mut s.spec {
                    let mut ctx = Vec::with_capacity(s.fed.len() + 1);
                    ctx.extend_from_slice(&s.fed);
                    ctx.extend_from_slice(&s.pending);
                    match sp.propose(&ctx, &mut s.state, self.model.max_context()) {
                        Ok(run) => {
                            takes[i] = run.len();
                            s.pending = run;
                            s.verifying = true;
                        }
                        Err(e) => {
                            let _ = s.job.tx.send(Event::Failed {
                                index: s.job.index,
                                message: format!("drafting failed: {e}"),
                            });
                            s.done = true;
                            takes[i] = 0;
                        }
                    }
                }
                continue;
            }
            let mut take = s.pending.len().min(budget);
            if !s.snapshotted && self.cache.is_some() {
                // Recurrent state: stop one token short of the prompt's end
                // once, so an identical prompt later can resume from there.
                let stop_at = s.job.prompt.len() - 1;
                if s.fed.len() == stop_at {
                    self.snapshot(s);
                } else {
                    take = take.min(stop_at - s.fed.len());
                }
            }
            budget -= take.min(budget);
            takes[i] = take;
        }
        let mut inputs: Vec<SeqInput> = Vec::new();
        let mut which = Vec::new();
        for (i, s) in active.iter_mut().enumerate() {
            if takes[i] == 0 {
                continue;
            }
            which.push(i);
            inputs.push(SeqInput {
                state: &mut s.state,
                tokens: &s.pending[..takes[i]],
                want: if s.verifying {
                    Logits::All
                } else {
                    Logits::Last
                },
            });
        }
        let result = self.model.forward_batch(&mut inputs);
        drop(inputs);
        let logits = match result {
            Ok(l) => l,
            Err(e) => {
                for &i in &which {
                    let s = &mut active[i];
                    let _ = s.job.tx.send(Event::Failed {
                        index: s.job.index,
                        message: format!("the forward failed: {e}"),
                    });
                    s.done = true;
                    s.state.trail = None;
                }
                return;
            }
        };
        for (&i, logits) in which.iter().zip(logits) {
            let s = &mut active[i];
            if s.verifying {
                self.settle(s, &logits);
                continue;
            }
            let t = takes[i];
            s.fed.extend(s.pending.drain(..t));
            if s.pending.is_empty() {
                self.sample(s, logits);
            }
        }
    }

    /// After a verify step: keeps the drafted tokens the target agreed with
    /// (the state is rewound to them) and emits them and the target's own.
    fn settle(&mut self, s: &mut Seq, logits: &[f32]) {
        let sp = s.spec.as_mut().expect("verifying sequences have a drafter");
        let drafted = s.pending.len() - 1;
        let produced = sp.settle(&mut s.state, logits, &mut s.sampler);
        let kept = produced.len();
        Metrics::add(&self.metrics().draft_tokens, drafted as u64);
        Metrics::add(&self.metrics().draft_tokens_accepted, kept as u64 - 1);
        s.fed.extend(s.pending.drain(..).take(kept));
        // Token j follows the positions up to pos0 + j + 1, as in plain decoding.
        let pos0 = s.state.pos - kept;
        for (j, &id) in produced.iter().enumerate() {
            if !self.emit(s, id, None, pos0 + j + 1, j + 1 == kept) {
                return;
            }
        }
    }

    /// Caches a recurrent sequence's state one token before its prompt ends.
    fn snapshot(&mut self, s: &mut Seq) {
        s.snapshotted = true;
        if let Some(c) = self.cache.as_mut() {
            c.insert(s.fed.clone(), s.state.snapshot());
        }
    }

    fn sample(&mut self, s: &mut Seq, mut logits: Vec<f32>) {
        let p = &s.job.params;
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &n) in &s.counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * n as f32;
                }
            }
        }
        if p.repeat_penalty != 1.0 {
            // `fed` is the prompt and every token sampled so far (a
            // penalized sequence does not draft, so nothing is pending).
            let n = p.repeat_last_n.unwrap_or(s.fed.len()).min(s.fed.len());
            repeat_penalize(&mut logits, &s.fed[s.fed.len() - n..], p.repeat_penalty);
        }
        bias_logits(&mut logits, &p.logit_bias);
        if let Some(c) = s.job.constraint.as_mut() {
            if let Err(message) = c.mask(&mut logits) {
                eprintln!("[serve] a choice ends early: {message}");
                self.finish(s, Finish::Constraint);
                return;
            }
        }
        let p = &s.job.params;
        let id = s.sampler.sample(&logits);
        let logprob = p.logprobs.map(|k| logprobs(&logits, id, k));
        let pos = s.state.pos;
        self.emit(s, id, logprob, pos, true);
    }

    /// Sends a generated token, which follows `pos` positions, unless it is
    /// a stop; false once the sequence ends. The `last` token of a step is
    /// queued to run next.
    fn emit(
        &mut self,
        s: &mut Seq,
        id: u32,
        logprob: Option<TokenLogprob>,
        pos: usize,
        last: bool,
    ) -> bool {
        let index = s.job.index;
        if self.stops.contains(&id) {
            self.finish(s, Finish::Stop);
            return false;
        }
        let mut complete = false;
        if let Some(c) = s.job.constraint.as_mut() {
            if let Err(message) = c.commit(id) {
                eprintln!("[serve] a choice ends early: {message}");
                self.finish(s, Finish::Constraint);
                return false;
            }
            complete = c.finished();
        }
        let now = Instant::now();
        if s.first_token.is_none() {
            s.first_token = Some(now);
            self.metrics()
                .ttft
                .observe((now - s.job.submitted).as_secs_f64());
        }
        s.generated += 1;
        *s.counts.entry(id).or_default() += 1;
        Metrics::add(&self.metrics().generated_tokens, 1);
        if s.job.tx.send(Event::Token { index, id, logprob }).is_err() {
            Metrics::add(&self.metrics().sequences_cancelled, 1);
            s.done = true;
            return false;
        }
        if complete {
            // The grammar allows nothing more: end as the stop token would.
            self.finish(s, Finish::Stop);
            return false;
        }
        if s.generated >= s.job.params.max_new || pos >= self.model.max_context() {
            self.finish(s, Finish::Length);
            return false;
        }
        if last {
            s.pending.push(id);
        }
        true
    }

    fn finish(&self, s: &mut Seq, finish: Finish) {
        let _ = s.job.tx.send(Event::Done {
            index: s.job.index,
            finish,
        });
        s.done = true;
    }

    fn retire_done(&mut self, active: &mut Vec<Seq>) {
        let mut i = 0;
        while i < active.len() {
            if !active[i].done {
                i += 1;
                continue;
            }
            let s = active.swap_remove(i);
            if let (Some(first), true) = (s.first_token, s.generated > 1) {
                let dt = first.elapsed().as_secs_f64();
                if dt > 0.0 {
                    self.metrics()
                        .decode_rate
                        .observe((s.generated - 1) as f64 / dt);
                }
            }
            if let Some(c) = self.cache.as_mut() {
                if s.state.pos == s.fed.len() && s.state.pos > 0 {
                    c.insert(s.fed, s.state);
                }
            }
        }
        // Admission order, for a stable batch layout.
        active.sort_by_key(|s| s.job.submitted);
    }
}

/// The chosen token's log-probability and the `k` most likely tokens'.
pub fn logprobs(logits: &[f32], id: u32, k: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let lse = f64::from(max) + sum.ln();
    let lp = |i: u32| (f64::from(logits[i as usize]) - lse) as f32;
    let k = k.min(logits.len());
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    };
    if k > 0 && k < idx.len() {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    TokenLogprob {
        logprob: lp(id),
        top: idx.into_iter().map(|i| (i, lp(i))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_of_the_argmax_top_the_list() {
        let l = [0.5, 2.0, 2.0, -1.0];
        let r = logprobs(&l, 1, 3);
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 2, 0]);
        assert_eq!(r.logprob, r.top[0].1);
        let total: f64 = l
            .iter()
            .map(|&x| f64::from(logprobs(&l, 0, 0).logprob - 0.5 + x).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}
