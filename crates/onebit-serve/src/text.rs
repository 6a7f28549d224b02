//! Turning generated text into what the client sees: stop strings cut, with
//! text that could still become a stop string held back while streaming, and
//! a `<think>...</think>` block routed to `reasoning_content`.

/// Finds the first stop string in generated text, emitting only what can no
/// longer be part of one.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    pub stopped: bool,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
            stopped: false,
        }
    }

    /// Adds text; returns what is safe to emit. After a stop string is found
    /// (`stopped`), it and everything after it are dropped.
    pub fn push(&mut self, piece: &str) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending.push_str(piece);
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.stopped = true;
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return out;
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let mut keep_from = self.pending.len();
        for (i, _) in self.pending.char_indices() {
            let tail = &self.pending[i..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep_from = i;
                break;
            }
        }
        let out = self.pending[..keep_from].to_string();
        self.pending.drain(..keep_from);
        out
    }

    /// The end of generation: whatever is held back is text after all.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Which field a piece of text belongs to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Nothing seen yet: the text may open with `<think>`.
    Start,
    Reasoning,
    /// After `</think>`, leading newlines are dropped.
    AfterReasoning,
    Content,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Splits a reasoning block off the start of the generated text.
#[derive(Debug)]
pub struct ThinkSplitter {
    enabled: bool,
    mode: Mode,
    held: String,
}

impl ThinkSplitter {
    /// `enabled`: the template knows `<think>`; `opened`: the prompt already
    /// ends inside an open `<think>` block (the template emitted it).
    pub fn new(enabled: bool, opened: bool) -> ThinkSplitter {
        ThinkSplitter {
            enabled,
            mode: if !enabled {
                Mode::Content
            } else if opened {
                Mode::Reasoning
            } else {
                Mode::Start
            },
            held: String::new(),
        }
    }

    pub fn push(&mut self, piece: &str) -> Split {
        let mut out = Split::default();
        if !self.enabled {
            out.content.push_str(piece);
            return out;
        }
        self.held.push_str(piece);
        loop {
            match self.mode {
                Mode::Content => {
                    out.content.push_str(&self.held);
                    self.held.clear();
                    return out;
                }
                Mode::Start => {
                    let t = self.held.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.held = rest.trim_start_matches('\n').to_string();
                        self.mode = Mode::Reasoning;
                    } else if t.is_empty() || OPEN.starts_with(t) {
                        return out; // could still be `<think>`
                    } else {
                        self.mode = Mode::Content;
                    }
                }
                Mode::Reasoning => {
                    if let Some(at) = self.held.find(CLOSE) {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held = self.held[at + CLOSE.len()..].to_string();
                        self.mode = Mode::AfterReasoning;
                        continue;
                    }
                    // Emit all but a suffix that could start `</think>`.
                    let mut keep = self.held.len();
                    for (i, _) in self.held.char_indices() {
                        if CLOSE.starts_with(&self.held[i..]) {
                            keep = i;
                            break;
                        }
                    }
                    out.reasoning.push_str(&self.held[..keep]);
                    self.held.drain(..keep);
                    return out;
                }
                Mode::AfterReasoning => {
                    let t = self.held.trim_start_matches('\n');
                    if t.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = t.to_string();
                    self.mode = Mode::Content;
                }
            }
        }
    }

    /// End of text: what is held goes where it was headed.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Reasoning => Split {
                reasoning: held,
                content: String::new(),
            },
            Mode::AfterReasoning => Split::default(),
            _ => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }
}

/// Drops trailing newlines of reasoning text (the template's `\n</think>`).
pub fn tidy_reasoning(s: &str) -> &str {
    s.trim_end_matches('\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_stops(stops: &[&str], pieces: &[&str]) -> (Vec<String>, String, bool) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut emitted = Vec::new();
        for p in pieces {
            emitted.push(m.push(p));
        }
        let rest = m.finish();
        (emitted, rest, m.stopped)
    }

    #[test]
    fn stop_string_split_over_pieces_is_cut_and_held_back() {
        let (e, rest, stopped) = run_stops(&["END"], &["Hello E", "N", "D world"]);
        assert_eq!(e, ["Hello ", "", ""]);
        assert_eq!(rest, "");
        assert!(stopped);
    }

    #[test]
    fn held_text_that_never_stops_comes_out() {
        let (e, rest, stopped) = run_stops(&["END", "\n\n"], &["a E", "x\n"]);
        assert_eq!(e, ["a ", "Ex"]);
        assert_eq!(rest, "\n");
        assert!(!stopped);
        let (e, _, stopped) = run_stops(&[], &["ab"]);
        assert_eq!(e, ["ab"]);
        assert!(!stopped);
    }

    #[test]
    fn earliest_stop_wins_and_multibyte_is_kept_whole() {
        let (e, _, _) = run_stops(&["é!", "b"], &["aé", "!b"]);
        assert_eq!(e.concat(), "a");
    }

    fn split_all(enabled: bool, opened: bool, pieces: &[&str]) -> Split {
        let mut s = ThinkSplitter::new(enabled, opened);
        let mut all = Split::default();
        for p in pieces {
            let x = s.push(p);
            all.reasoning += &x.reasoning;
            all.content += &x.content;
        }
        let x = s.finish();
        all.reasoning += &x.reasoning;
        all.content += &x.content;
        all
    }

    #[test]
    fn think_block_goes_to_reasoning() {
        let s = split_all(
            true,
            false,
            &["<thi", "nk>\nstep 1\n</th", "ink>\n\nThe answer."],
        );
        assert_eq!(tidy_reasoning(&s.reasoning), "step 1");
        assert_eq!(s.content, "The answer.");
        let s = split_all(true, true, &["hmm</think>", "\n\nok"]);
        assert_eq!(s.reasoning, "hmm");
        assert_eq!(s.content, "ok");
        let s = split_all(true, false, &["<b>no think</b>"]);
        assert_eq!(s.content, "<b>no think</b>");
        let s = split_all(false, false, &["<think>x</think>y"]);
        assert_eq!(s.content, "<think>x</think>y");
        // Unfinished reasoning stays reasoning.
        let s = split_all(true, false, &["<think>still going"]);
        assert_eq!(
            (s.reasoning.as_str(), s.content.as_str()),
            ("still going", "")
        );
    }
}
