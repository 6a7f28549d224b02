//! The engine thread: it owns the model and, each step, runs one batched
//! forward over every active sequence (a chunk of prompt for those still
//! prefilling, one token for those decoding, a chunk of text for embedding
//! requests), then samples each sequence's next token. Since `forward_batch`
//! gives each sequence exactly the logits (or hidden rows) it would get alone,
//! a greedy request gets the same tokens, and an embedding the same vector,
//! however many others share its steps and however its prompt is chunked.
//!
//! Requests wait in a bounded queue and are admitted as slots free (an
//! embedding request is one slot, its inputs run one after another). A
//! sequence whose client went away (its event receiver dropped) or that the
//! server cancelled (a stop string) is freed before the next step, and so is
//! an embedding request whose client hung up.
//!
//! Each step's prompt budget is `prefill_chunk` tokens, given to the prompts
//! and embedding requests with the least left first; while any sequence is
//! decoding, it is also held to what the machine runs within `max_step` (its
//! measured cost model, [`crate::pace`]), so a running stream's gap between two tokens
//! stays near `max_step` while a long prompt prefills.
//!
//! A prompt's images ([`Job::images`]) are encoded by the model's vision
//! tower on this thread when the prefill first reaches them (an image whose
//! rows the prefix cache holds is not encoded again, nor one whose rows a
//! recent request encoded: [`ENCODED_KEEP`], keyed by the pixels' hash),
//! and their rows enter the same batched forward in place of their
//! placeholder ids. One image's rows never straddle two steps: a chunk stops
//! before an image or takes all of it, since they attend to each other both
//! ways (Gemma 3) within one forward call; and a cached prefix that ends
//! inside an image is cut back to the image's start.
//!
//! A panic while one sequence is sampled fails that sequence alone; one in
//! the batched forward fails the sequences of that batch; the engine thread
//! goes on either way (a backstop: the tests require no panic).

use std::collections::{HashMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use onebit_model::sampler::{bias_logits, repeat_penalize, Sampler, SamplerConfig};
use onebit_model::semantics::Mask;
use onebit_model::spec::{SpecPlan, Speculator};
use onebit_model::vision::ImageEmbeddings;
use onebit_model::{Embeds, Logits, Model, SeqInput, SeqState};
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::oneshot;

use crate::cache::{rewindable, PrefixCache};
use crate::constrain::Constraint;
use crate::images::{PromptImage, Tower};
use crate::metrics::Metrics;
use crate::pace::{self, Pace};
use crate::pooling::{PoolSum, Pooling};

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

impl GenParams {
    /// Greedy decoding of at most `max_new` tokens: no penalty, no bias, no
    /// logprobs, no drafting.
    pub fn greedy(max_new: usize) -> GenParams {
        GenParams {
            max_new,
            sampler: SamplerConfig::default(),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repeat_penalty: 1.0,
            repeat_last_n: None,
            logprobs: None,
            speculative: false,
            logit_bias: Vec::new(),
        }
    }
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
    /// The prompt's images, sorted by place: the ids `start..start +
    /// tokens` of `prompt` are their placeholders.
    pub images: Vec<PromptImage>,
}

impl Job {
    /// Choice `index` of `prompt` under `params`, submitted now, with no
    /// constraint and no images, its events sent on `tx`.
    pub fn new(
        prompt: Arc<Vec<u32>>,
        params: GenParams,
        index: usize,
        tx: UnboundedSender<Event>,
    ) -> Job {
        Job {
            prompt,
            params,
            index,
            tx,
            cancel: Arc::new(AtomicBool::new(false)),
            submitted: Instant::now(),
            constraint: None,
            images: Vec::new(),
        }
    }
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
    /// The vision tower encoded `images` of the prompt's images in
    /// `seconds` (those found already encoded are not counted).
    Encoded {
        index: usize,
        images: usize,
        seconds: f64,
    },
}

#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Sequences decoded together at most.
    pub max_seqs: usize,
    /// Sequences waiting at most; beyond, submissions are refused.
    pub max_queue: usize,
    /// Prompt tokens prefilled per step at most, over all sequences.
    pub prefill_chunk: usize,
    /// While a sequence is decoding, a step's prompt tokens are also held to
    /// what the machine runs in this long (its measured rate); zero: no
    /// bound but `prefill_chunk`.
    pub max_step: Duration,
    pub prefix_cache: bool,
    /// Bytes the prefix cache may hold; None: [`default_cache_bytes`] of
    /// the model.
    pub cache_bytes: Option<usize>,
    /// Speculative decoding for the sequences that ask for it.
    pub spec: Option<Arc<SpecPlan>>,
    /// Tests only (the binary never sets it): called with a sequence's
    /// prompt each time a token of it is sampled, to inject a fault.
    pub fault: Option<FaultHook>,
    /// The model's vision tower, which encodes the jobs' images.
    pub vision: Option<Tower>,
}

/// Encoded images the engine keeps beside the prefix cache, most recent
/// first, so the same picture in another prompt is not encoded again.
pub const ENCODED_KEEP: usize = 8;

/// A test's fault injector (see [`EngineConfig::fault`]).
#[derive(Clone)]
pub struct FaultHook(pub Arc<FaultFn>);

/// What a [`FaultHook`] calls: given a sequence's prompt.
pub type FaultFn = dyn Fn(&[u32]) + Send + Sync;

impl std::fmt::Debug for FaultHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FaultHook")
    }
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

/// What requests cut by the end of a shutdown's timeout fail with (see
/// [`Engine::cut`]); the HTTP side answers it as a 503.
pub const SHUTTING_DOWN: &str =
    "the server is shutting down: this request was cut at the end of its --shutdown-timeout";

/// Work that needs the model but is not a sequence to decode: run on the
/// engine thread between two steps, whole (nothing bounds how long it takes;
/// embeddings are an [`EmbedJob`] instead).
pub type Task = Box<dyn FnOnce(&Model) + Send>;

/// One embedding request: each input runs on a fresh state, in chunks under
/// the step's prompt budget like a prompt (whole, for a model whose attention
/// is bidirectional), its hidden rows pooled as they come.
pub struct EmbedJob {
    /// The inputs' tokens, each within the context.
    pub inputs: Vec<Vec<u32>>,
    pub pooling: Pooling,
    /// The vectors in input order, or why the request failed. Dropping the
    /// receiver (the client hung up) frees the request before the next step.
    pub reply: oneshot::Sender<EmbedReply>,
    pub submitted: Instant,
}

/// An embedding request's answer: its vectors in input order, or why it failed.
pub type EmbedReply = Result<Vec<Vec<f32>>, String>;

/// What waits in the queue.
enum Work {
    /// (Boxed: a job with a grammar is large.)
    Gen(Box<Job>),
    Embed(EmbedJob),
}

impl Work {
    /// Its client is gone or the server cancelled it.
    fn abandoned(&self) -> bool {
        match self {
            Work::Gen(j) => j.tx.is_closed() || j.cancel.load(Ordering::Relaxed),
            Work::Embed(e) => e.reply.is_closed(),
        }
    }

    fn fail(self, message: &str) {
        match self {
            Work::Gen(j) => {
                let _ = j.tx.send(Event::Failed {
                    index: j.index,
                    message: message.to_string(),
                });
            }
            Work::Embed(e) => {
                let _ = e.reply.send(Err(message.to_string()));
            }
        }
    }
}

struct Queue {
    waiting: VecDeque<Work>,
    tasks: VecDeque<Task>,
    shutdown: bool,
    /// Set by [`Engine::cut`]: fail everything with this message and stop.
    cut: Option<String>,
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
                cut: None,
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

    fn queue(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `work` (`n` entries) within the queue bound, or none of it.
    fn enqueue(&self, work: Vec<Work>) -> Result<(), QueueFull> {
        let mut q = self.queue();
        let n = work.len();
        if q.waiting.len() + q.tasks.len() + n > self.shared.max_queue {
            // Requests whose clients hung up while waiting hold no slot.
            let before = q.waiting.len();
            q.waiting.retain(|w| !w.abandoned());
            Metrics::add(
                &self.shared.metrics.sequences_cancelled,
                (before - q.waiting.len()) as u64,
            );
        }
        if q.shutdown || q.waiting.len() + q.tasks.len() + n > self.shared.max_queue {
            return Err(QueueFull);
        }
        q.waiting.extend(work);
        self.shared
            .metrics
            .queue_depth
            .store(q.waiting.len() as u64, Ordering::Relaxed);
        drop(q);
        self.shared.wake.notify_one();
        Ok(())
    }

    /// Queues all of a request's sequences, or none when they do not fit.
    pub fn submit(&self, jobs: Vec<Job>) -> Result<(), QueueFull> {
        self.enqueue(jobs.into_iter().map(|j| Work::Gen(Box::new(j))).collect())
    }

    /// Queues an embedding request (one entry of the queue, one slot).
    pub fn embed(&self, job: EmbedJob) -> Result<(), QueueFull> {
        self.enqueue(vec![Work::Embed(job)])
    }

    /// Queues `task` to run on the engine thread before its next step, within
    /// the same queue bound as sequences.
    pub fn run_task(&self, task: Task) -> Result<(), QueueFull> {
        let mut q = self.queue();
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
        self.queue().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
    }

    /// Refuses new work and, before the next step, fails every active and
    /// queued request with `message` (each sequence gets
    /// [`Event::Failed`], each embedding request its error), then the
    /// thread ends. What a shutdown does when its timeout runs out.
    pub fn cut(&self, message: &str) {
        {
            let mut q = self.queue();
            q.shutdown = true;
            q.cut = Some(message.to_string());
        }
        self.shared.wake.notify_all();
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
    /// A panic hit this sequence: its state is not cached.
    poisoned: bool,
    /// The prompt's images, with their rows once encoded.
    images: Vec<SeqImage>,
}

/// One image of a sequence's prompt.
struct SeqImage {
    place: PromptImage,
    rows: Option<Arc<ImageEmbeddings>>,
}

impl SeqImage {
    fn span(&self) -> (usize, usize) {
        (self.place.start, self.place.start + self.place.image.tokens)
    }
}

/// How many of `take` tokens after `fed` a prompt chunk runs so that no
/// image's rows are split: a chunk that would end inside an image stops
/// before it, or, when the image comes first, takes it whole.
fn keep_images_whole(images: &[SeqImage], fed: usize, take: usize) -> usize {
    let mut end = fed + take;
    for img in images {
        let (a, b) = img.span();
        if a < end && end < b {
            end = if a > fed { a } else { b };
        }
    }
    end - fed
}

/// An embedding request being run: its inputs in order, at most one of
/// them part-way (`cur`), the vectors of those done.
struct EmbedRun {
    inputs: Vec<Vec<u32>>,
    pooling: Pooling,
    /// Taken when the answer (or the error) is sent.
    reply: Option<oneshot::Sender<EmbedReply>>,
    /// The next input to start.
    next: usize,
    cur: Option<Part>,
    /// This step's inputs and how many tokens each runs.
    parts: Vec<(Part, usize)>,
    out: Vec<Vec<f32>>,
    done: bool,
}

/// One input of an embedding request part-way through.
struct Part {
    input: usize,
    state: SeqState,
    /// Tokens run so far.
    fed: usize,
    sum: PoolSum,
}

impl EmbedRun {
    /// Tokens still to run, over all its inputs.
    fn left(&self) -> usize {
        let cur = self
            .cur
            .as_ref()
            .map_or(0, |p| self.inputs[p.input].len() - p.fed);
        cur + self.inputs[self.next..].iter().map(Vec::len).sum::<usize>()
    }

    /// Its client hung up.
    fn gone(&self) -> bool {
        self.reply.as_ref().is_none_or(|r| r.is_closed())
    }

    fn answer(&mut self, r: EmbedReply) {
        if let Some(tx) = self.reply.take() {
            let _ = tx.send(r);
        }
        self.done = true;
        self.parts.clear();
        self.cur = None;
    }

    fn fail(&mut self, message: String) {
        self.answer(Err(message));
    }
}

struct Worker {
    model: Model,
    stops: Vec<u32>,
    cfg: EngineConfig,
    shared: Arc<Shared>,
    cache: Option<PrefixCache>,
    rewindable: bool,
    pace: Pace,
    /// Recently encoded images by their pixels' hash, most recent first.
    encoded: VecDeque<([u8; 32], Arc<ImageEmbeddings>)>,
    /// The threads the vision tower encodes on, made at the first image.
    vision_pool: Option<onebit_kernels::Pool>,
}

/// What a panic carried, as text.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}

/// `f`'s result, a panic inside it turned into a model error naming it.
fn contained<T>(
    f: impl FnOnce() -> Result<T, onebit_model::ModelError>,
) -> Result<T, onebit_model::ModelError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(onebit_model::ModelError::Input(format!(
            "it panicked: {}",
            panic_text(&*p)
        )))
    })
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
            pace: Pace::new(cfg.max_step),
            model,
            stops,
            cfg,
            shared,
            cache,
            rewindable,
            encoded: VecDeque::new(),
            vision_pool: None,
        }
    }

    fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The gauges a scheduler reads: running sequences and their KV positions.
    /// (An embedding request counts as one sequence.)
    fn publish(&self, active: &[Seq], embeds: &[EmbedRun]) {
        let m = self.metrics();
        m.active_sequences
            .store((active.len() + embeds.len()) as u64, Ordering::Relaxed);
        let embedding: usize = embeds
            .iter()
            .filter_map(|r| r.cur.as_ref())
            .map(|p| p.fed)
            .sum();
        m.kv_positions.store(
            active.iter().map(|s| s.fed.len() as u64).sum::<u64>() + embedding as u64,
            Ordering::Relaxed,
        );
    }

    fn run(mut self) {
        let mut active: Vec<Seq> = Vec::new();
        let mut embeds: Vec<EmbedRun> = Vec::new();
        loop {
            let (admitted, tasks): (Vec<Work>, Vec<Task>) = {
                let mut q = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
                while q.waiting.is_empty()
                    && q.tasks.is_empty()
                    && active.is_empty()
                    && embeds.is_empty()
                    && !q.shutdown
                {
                    q = self.shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                if let Some(message) = q.cut.clone() {
                    // Everything fails now, with the reason; the thread ends.
                    q.tasks.clear();
                    for w in q.waiting.drain(..) {
                        w.fail(&message);
                    }
                    drop(q);
                    for s in active.iter_mut() {
                        self.fail(s, message.clone());
                    }
                    for r in embeds.iter_mut() {
                        r.fail(message.clone());
                    }
                    self.publish(&[], &[]);
                    self.metrics().queue_depth.store(0, Ordering::Relaxed);
                    return;
                }
                let tasks: Vec<Task> = q.tasks.drain(..).collect();
                if q.shutdown
                    && q.waiting.is_empty()
                    && active.is_empty()
                    && embeds.is_empty()
                    && tasks.is_empty()
                {
                    return;
                }
                let room = self
                    .cfg
                    .max_seqs
                    .saturating_sub(active.len() + embeds.len());
                let n = room.min(q.waiting.len());
                let jobs = q.waiting.drain(..n).collect();
                self.metrics()
                    .queue_depth
                    .store(q.waiting.len() as u64, Ordering::Relaxed);
                (jobs, tasks)
            };
            for task in tasks {
                let model = &self.model;
                if let Err(p) = catch_unwind(AssertUnwindSafe(|| task(model))) {
                    eprintln!("[serve] a task on the engine panicked: {}", panic_text(&*p));
                }
            }
            for work in admitted {
                match work {
                    Work::Gen(job) => {
                        if let Some(s) = self.admit(*job) {
                            active.push(s);
                        }
                    }
                    Work::Embed(job) => {
                        if job.reply.is_closed() {
                            Metrics::add(&self.metrics().sequences_cancelled, 1);
                            continue;
                        }
                        let n = job.inputs.len();
                        embeds.push(EmbedRun {
                            inputs: job.inputs,
                            pooling: job.pooling,
                            reply: Some(job.reply),
                            next: 0,
                            cur: None,
                            parts: Vec::new(),
                            out: Vec::with_capacity(n),
                            done: false,
                        });
                    }
                }
            }
            // Free what clients no longer want.
            for s in active.iter_mut() {
                if s.job.tx.is_closed() || s.job.cancel.load(Ordering::Relaxed) {
                    Metrics::add(&self.metrics().sequences_cancelled, 1);
                    s.done = true;
                }
            }
            for r in embeds.iter_mut() {
                if r.gone() {
                    Metrics::add(&self.metrics().sequences_cancelled, 1);
                    r.done = true;
                }
            }
            self.retire_done(&mut active);
            embeds.retain(|r| !r.done);
            self.publish(&active, &embeds);
            if active.is_empty() && embeds.is_empty() {
                continue;
            }
            self.step(&mut active, &mut embeds);
            self.retire_done(&mut active);
            embeds.retain(|r| !r.done);
            self.publish(&active, &embeds);
        }
    }

    /// Ends `s` with an error to its client.
    fn fail(&self, s: &mut Seq, message: String) {
        if !s.done {
            let _ = s.job.tx.send(Event::Failed {
                index: s.job.index,
                message,
            });
        }
        s.done = true;
    }

    fn admit(&mut self, job: Job) -> Option<Seq> {
        if job.tx.is_closed() || job.cancel.load(Ordering::Relaxed) {
            Metrics::add(&self.metrics().sequences_cancelled, 1);
            return None;
        }
        let prompt = job.prompt.clone();
        let lookup = |cache: &mut Option<PrefixCache>, upto: usize| {
            cache.as_mut().and_then(|c| c.lookup(&prompt[..upto]))
        };
        let mut hit = lookup(&mut self.cache, prompt.len());
        // A cached prefix ending inside an image: resume before the image
        // (its rows run in one forward call), looked up again within it.
        if let Some(img) = hit.as_ref().and_then(|&(_, cached)| {
            job.images
                .iter()
                .find(|i| i.start < cached && cached < i.start + i.image.tokens)
        }) {
            hit = lookup(&mut self.cache, img.start + 1);
        }
        let (state, cached) = hit.unwrap_or_else(|| (self.model.new_state(), 0));
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
            poisoned: false,
            images: job
                .images
                .iter()
                .map(|p| SeqImage {
                    place: p.clone(),
                    rows: None,
                })
                .collect(),
            job,
        })
    }

    /// One batched forward and the sampling that follows it.
    fn step(&mut self, active: &mut [Seq], embeds: &mut [EmbedRun]) {
        let t0 = Instant::now();
        let decoding = active.iter().any(|s| s.generated > 0);
        // How many prompt tokens this step may run, over all sequences.
        let full = self.cfg.prefill_chunk.max(1);
        let mut takes = vec![0usize; active.len()];
        // Decoding sequences run their last sampled token every step.
        for (i, s) in active.iter_mut().enumerate() {
            if s.generated == 0 || s.done {
                continue;
            }
            // Decoding: the last sampled token, and any draft after it.
            takes[i] = 1;
            s.verifying = false;
            let Some(sp) = &mut s.spec else { continue };
            let mut ctx = Vec::with_capacity(s.fed.len() + 1);
            ctx.extend_from_slice(&s.fed);
            ctx.extend_from_slice(&s.pending);
            let max_context = self.model.max_context();
            let state = &mut s.state;
            let proposed = contained(|| sp.propose(&ctx, state, max_context));
            match proposed {
                Ok(run) => {
                    takes[i] = run.len();
                    s.pending = run;
                    s.verifying = true;
                }
                Err(e) => {
                    takes[i] = 0;
                    s.poisoned = true;
                    let _ = s.job.tx.send(Event::Failed {
                        index: s.job.index,
                        message: format!("drafting failed: {e}"),
                    });
                    s.done = true;
                }
            }
        }
        // The prompt budget goes to the prompts and embedding requests with
        // the least left first, so a short request is not held behind a long
        // prompt's whole prefill (the long one still gets the rest of every
        // step's budget). Ties keep admission order.
        enum Want {
            Prompt(usize),
            Embed(usize),
        }
        let mut order: Vec<(usize, Want)> = active
            .iter()
            .enumerate()
            .filter(|(_, s)| s.generated == 0 && !s.done)
            .map(|(i, s)| (s.pending.len(), Want::Prompt(i)))
            .chain(
                embeds
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.left(), Want::Embed(i))),
            )
            .collect();
        order.sort_by_key(|(left, _)| *left);
        // The budget is reckoned from where the first of them stands (the
        // positions its tokens attend to).
        let start = order.first().map_or(0, |(_, w)| match w {
            Want::Prompt(i) => active[*i].fed.len(),
            Want::Embed(i) => embeds[*i].cur.as_ref().map_or(0, |p| p.fed),
        });
        let mut budget = self.pace.budget(full, decoding, start);
        let whole_inputs = self.model.sem.mask.value == Mask::Bidirectional;
        for (_, want) in order {
            match want {
                Want::Prompt(i) => {
                    let s = &mut active[i];
                    let mut take = s.pending.len().min(budget);
                    if !s.snapshotted && self.cache.is_some() {
                        // Recurrent state: stop one token short of the prompt's
                        // end once, so an identical prompt later can resume
                        // from there.
                        let stop_at = s.job.prompt.len() - 1;
                        if s.fed.len() == stop_at {
                            self.snapshot(s);
                        } else {
                            take = take.min(stop_at - s.fed.len());
                        }
                    }
                    let take = keep_images_whole(&s.images, s.fed.len(), take);
                    budget -= take.min(budget);
                    takes[i] = take;
                }
                Want::Embed(i) => {
                    let spent =
                        self.plan_embed(&mut embeds[i], budget, budget == full, whole_inputs);
                    budget -= spent.min(budget);
                }
            }
        }
        // The images this step's chunks reach, encoded (or found) first;
        // their time is no prompt token's cost.
        let mut encode_secs = 0.0;
        for (i, s) in active.iter_mut().enumerate() {
            if takes[i] == 0 || s.done || s.generated > 0 {
                continue;
            }
            let (from, to) = (s.fed.len(), s.fed.len() + takes[i]);
            let (mut encoded, mut seconds) = (0, 0.0);
            for k in 0..s.images.len() {
                let (a, _) = s.images[k].span();
                if a < from || a >= to || s.images[k].rows.is_some() {
                    continue;
                }
                match self.image_rows(&s.images[k].place) {
                    Ok((rows, secs)) => {
                        s.images[k].rows = Some(rows);
                        if let Some(secs) = secs {
                            encoded += 1;
                            seconds += secs;
                        }
                    }
                    Err(message) => {
                        takes[i] = 0;
                        self.fail(s, message);
                        break;
                    }
                }
            }
            encode_secs += seconds;
            if encoded > 0 && !s.done {
                let _ = s.job.tx.send(Event::Encoded {
                    index: s.job.index,
                    images: encoded,
                    seconds,
                });
            }
        }
        // What the step's prompt tokens cost: how many, and the positions
        // they attend to.
        let mut work = pace::Work::default();
        for (s, &take) in active.iter().zip(&takes) {
            if s.generated == 0 && take > 0 {
                work.add(pace::Work::chunk(s.fed.len(), take));
            }
        }
        for r in embeds.iter() {
            for (part, take) in &r.parts {
                work.add(pace::Work::chunk(part.fed, *take));
            }
        }
        let mut inputs: Vec<SeqInput> = Vec::new();
        let mut rows: Vec<Vec<Embeds>> = Vec::new();
        let mut which = Vec::new();
        for (i, s) in active.iter_mut().enumerate() {
            if takes[i] == 0 || s.done {
                continue;
            }
            which.push(i);
            let from = s.fed.len();
            rows.push(
                s.images
                    .iter()
                    .filter(|img| (from..from + takes[i]).contains(&img.place.start))
                    .filter_map(|img| img.rows.as_ref().map(|r| r.at(img.place.start - from)))
                    .collect(),
            );
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
        for r in embeds.iter_mut() {
            let inputs_of = &r.inputs;
            for (part, take) in r.parts.iter_mut() {
                rows.push(Vec::new());
                inputs.push(SeqInput {
                    state: &mut part.state,
                    tokens: &inputs_of[part.input][part.fed..part.fed + *take],
                    want: Logits::Hidden,
                });
            }
        }
        if inputs.is_empty() {
            return;
        }
        let model = &self.model;
        let lists: Vec<&[Embeds]> = if rows.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            rows.iter().map(Vec::as_slice).collect()
        };
        let result = contained(|| model.forward_batch_embeds(&mut inputs, &lists));
        drop(inputs);
        drop(lists);
        drop(rows);
        let mut logits = match result {
            Ok(l) => l.into_iter(),
            Err(e) => {
                // The states of the batch may be part-way through a layer.
                let message = format!("the forward failed: {e}");
                for &i in &which {
                    let s = &mut active[i];
                    s.poisoned = true;
                    s.state.trail = None;
                    self.fail(s, message.clone());
                }
                for r in embeds.iter_mut().filter(|r| !r.parts.is_empty()) {
                    r.fail(message.clone());
                }
                return;
            }
        };
        for (&i, out) in which.iter().zip(logits.by_ref()) {
            let s = &mut active[i];
            let r = catch_unwind(AssertUnwindSafe(|| {
                if s.verifying {
                    self.settle(s, &out);
                    return;
                }
                let t = takes[i];
                s.fed.extend(s.pending.drain(..t));
                if s.pending.is_empty() {
                    self.sample(s, out);
                }
            }));
            if let Err(p) = r {
                // Only this sequence: the others of the batch go on.
                let what = panic_text(&*p);
                eprintln!("[serve] a sequence panicked while sampling ({what}); it fails, the others go on");
                s.poisoned = true;
                self.fail(
                    s,
                    format!(
                        "the server failed on this sequence (an internal error, logged): {what}"
                    ),
                );
            }
        }
        for r in embeds.iter_mut() {
            let parts = std::mem::take(&mut r.parts);
            for ((mut part, take), rows) in parts.into_iter().zip(logits.by_ref()) {
                part.sum.push(&rows);
                part.fed += take;
                if part.fed < r.inputs[part.input].len() {
                    r.cur = Some(part);
                    continue;
                }
                let model = &self.model;
                let v = part.sum.finish_through(|v| model.pooled_head(v));
                r.out.push(v);
            }
            if r.out.len() == r.inputs.len() {
                let out = std::mem::take(&mut r.out);
                r.answer(Ok(out));
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        if decoding && self.pace.max_step > 0.0 && secs > 4.0 * self.pace.max_step {
            eprintln!(
                "[serve] a step took {secs:.2} s, over 4 x --max-step-ms ({} prompt tokens, {} sequences): the machine is slower than measured",
                work.tokens,
                active.len() + embeds.len()
            );
        }
        self.pace.observe((secs - encode_secs).max(0.0), work);
    }

    /// Picks the inputs `r` runs this step within `budget` tokens (into
    /// `r.parts`), in order, the one part-way first; returns the tokens
    /// taken. With `whole` (bidirectional attention) an input runs all at
    /// once: one longer than the budget waits for a step of its own
    /// (`fresh`: nothing else took from this step's budget yet).
    fn plan_embed(&self, r: &mut EmbedRun, budget: usize, fresh: bool, whole: bool) -> usize {
        let width = self.model.sem.dims.n_embd;
        let mut spent = 0;
        while spent < budget {
            let part = match r.cur.take() {
                Some(p) => p,
                None if r.next < r.inputs.len() => {
                    r.next += 1;
                    Part {
                        input: r.next - 1,
                        state: self.model.new_state(),
                        fed: 0,
                        sum: r.pooling.start(width),
                    }
                }
                None => break,
            };
            let left = r.inputs[part.input].len() - part.fed;
            let room = budget - spent;
            let take = if !whole {
                left.min(room)
            } else if left <= room || (fresh && spent == 0) {
                left
            } else {
                r.cur = Some(part);
                break;
            };
            spent += take;
            let partial = take < left;
            r.parts.push((part, take));
            if partial {
                break;
            }
        }
        spent
    }

    /// The rows of one prompt image: a recent encoding of the same pixels,
    /// else the tower's (timed into `/metrics`; the seconds are returned
    /// for an encoding, None for a reuse). A failure names the image's
    /// problem; the sequence fails with it.
    fn image_rows(
        &mut self,
        place: &PromptImage,
    ) -> Result<(Arc<ImageEmbeddings>, Option<f64>), String> {
        let img = &place.image;
        if let Some(k) = self.encoded.iter().position(|(h, _)| *h == img.hash) {
            let hit = self.encoded.remove(k).expect("position is within the list");
            let rows = hit.1.clone();
            self.encoded.push_front(hit);
            Metrics::add(&self.metrics().images_reused, 1);
            return Ok((rows, None));
        }
        let Some(tower) = &self.cfg.vision else {
            return Err("the model has no vision tower, so its images cannot be run".into());
        };
        let t0 = Instant::now();
        let tower = &tower.0;
        let threads = self.model.threads();
        let pool = self
            .vision_pool
            .get_or_insert_with(|| onebit_kernels::Pool::new(threads));
        let out = contained(|| {
            tower.encode_sized(pool, &img.pixels, img.width as u32, img.height as u32)
        })
        .map_err(|e| format!("encoding the image failed: {e}"))?;
        let secs = t0.elapsed().as_secs_f64();
        Metrics::add(&self.metrics().images_encoded, 1);
        self.metrics().image_encode.observe(secs);
        let width = self.model.sem.input_width();
        if out.n_tokens != img.tokens || out.n_embd != width {
            return Err(format!(
                "the vision tower gave {} rows of {} values for an image of {} placeholders in a model of input width {width}",
                out.n_tokens, out.n_embd, img.tokens
            ));
        }
        let rows = Arc::new(out);
        self.encoded.push_front((img.hash, rows.clone()));
        self.encoded.truncate(ENCODED_KEEP);
        Ok((rows, Some(secs)))
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
        if let Some(hook) = &self.cfg.fault {
            (hook.0)(&s.job.prompt);
        }
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
            if let Some(c) = self.cache.as_mut().filter(|_| !s.poisoned) {
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
    fn a_chunk_never_splits_an_image() {
        // Two images of 4 rows at 3..7 and 9..13.
        let img = |start: usize| SeqImage {
            place: PromptImage {
                start,
                image: Arc::new(onebit_image::Prepared {
                    width: 1,
                    height: 1,
                    pixels: vec![0.0; 3],
                    hash: [0; 32],
                    tokens: 4,
                }),
            },
            rows: None,
        };
        let images = [img(3), img(9)];
        // (fed, take) -> tokens run.
        for ((fed, take), want) in [
            ((0, 2), 2),   // ends before the image
            ((0, 3), 3),   // ends at its start
            ((0, 5), 3),   // would end inside: stops before it
            ((3, 1), 4),   // starts at it: takes it whole
            ((3, 6), 6),   // the image and the text after it
            ((3, 7), 6),   // into the next image: stops before that one
            ((0, 13), 13), // both whole
            ((7, 0), 0),   // no budget
        ] {
            assert_eq!(
                keep_images_whole(&images, fed, take),
                want,
                "{fed} + {take}"
            );
        }
    }

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
