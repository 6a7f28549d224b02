//! Streaming a JSON tool call's arguments as they are generated: a scanner
//! over the call text (JSON formats: one object per call, a list of them, or
//! the generic envelope) that announces each call once its name is complete
//! and then gives its arguments in fragments, each a piece of the compact
//! serialization serde_json gives the finished arguments (strings and
//! numbers re-encoded once complete, whitespace dropped, key order kept), so
//! the fragments reassemble to the non-streamed `function.arguments`.

/// What the scanner found in the text fed so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgEvent {
    /// Call `index` begins: its function name.
    Call { index: usize, name: String },
    /// More of call `index`'s arguments.
    Args { index: usize, fragment: String },
}

/// One call being read.
#[derive(Default)]
struct CallState {
    name: Option<String>,
    /// Canonical argument text not yet given out (held until the name is known).
    pending: String,
    announced: bool,
    /// The arguments value is a string (a JSON text inside a string): not
    /// streamed, given whole at the end.
    opaque: bool,
}

/// A scanner over the text of one reply's calls.
pub struct ArgScanner {
    /// The nesting depth at which a call object's keys sit (1: the reply is
    /// the call object; 2: a list of calls; 3: `{"tool_calls": [..]}`).
    call_depth: usize,
    args_keys: [&'static str; 3],
    /// Open containers: true for an object.
    stack: Vec<bool>,
    /// In an object, whether the next string is a key.
    expect_key: bool,
    /// The last key read at each depth.
    keys: Vec<Option<String>>,
    /// The raw text of a string or scalar still being read.
    token: String,
    in_string: bool,
    escaped: bool,
    calls: Vec<CallState>,
    /// Depth at which the current call's arguments value began (its
    /// containers and scalars are copied while the depth is at least this).
    args_at: Option<usize>,
    events: Vec<ArgEvent>,
    /// The text stopped being JSON the scanner can follow.
    broken: bool,
}

impl ArgScanner {
    pub fn new(call_depth: usize, args_key: &'static str) -> ArgScanner {
        ArgScanner {
            call_depth,
            args_keys: [args_key, "arguments", "parameters"],
            stack: Vec::new(),
            expect_key: false,
            keys: vec![None],
            token: String::new(),
            in_string: false,
            escaped: false,
            calls: Vec::new(),
            args_at: None,
            events: Vec::new(),
            broken: false,
        }
    }

    /// The events found since the last call.
    pub fn take(&mut self) -> Vec<ArgEvent> {
        std::mem::take(&mut self.events)
    }

    /// Feeds more of the reply's call text.
    pub fn feed(&mut self, text: &str) {
        for c in text.chars() {
            if self.broken {
                return;
            }
            self.char(c);
        }
    }

    fn depth(&self) -> usize {
        self.stack.len()
    }

    /// Whether the text at the current depth belongs to the current call's
    /// arguments.
    fn in_args(&self) -> bool {
        self.args_at.is_some_and(|d| self.depth() >= d)
    }

    fn emit(&mut self, s: &str) {
        if !self.in_args() {
            return;
        }
        let index = self.calls.len() - 1;
        let call = &mut self.calls[index];
        if call.opaque {
            return;
        }
        call.pending.push_str(s);
        self.flush(index);
    }

    fn flush(&mut self, index: usize) {
        let call = &mut self.calls[index];
        let Some(name) = &call.name else { return };
        if !call.announced {
            call.announced = true;
            self.events.push(ArgEvent::Call {
                index,
                name: name.clone(),
            });
        }
        if !call.pending.is_empty() {
            let more = std::mem::take(&mut call.pending);
            // One fragment per call per feed: consecutive pieces join.
            match self.events.last_mut() {
                Some(ArgEvent::Args { index: i, fragment }) if *i == index => {
                    fragment.push_str(&more)
                }
                _ => self.events.push(ArgEvent::Args {
                    index,
                    fragment: more,
                }),
            }
        }
    }

    fn char(&mut self, c: char) {
        if self.in_string {
            self.token.push(c);
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                let raw = std::mem::take(&mut self.token);
                self.string(&raw);
            }
            return;
        }
        let scalar_char = c.is_ascii_alphanumeric() || "+-.".contains(c);
        if scalar_char && !self.stack.is_empty() {
            self.token.push(c);
            return;
        }
        if !self.token.is_empty() {
            let raw = std::mem::take(&mut self.token);
            self.scalar(&raw);
        }
        if self.stack.is_empty() {
            // Between calls (markers, `;`, whitespace): only a container opens.
            if c == '{' || c == '[' {
                self.open(c == '{');
            }
            return;
        }
        match c {
            '"' => {
                self.in_string = true;
                self.token.push('"');
            }
            '{' | '[' => self.open(c == '{'),
            '}' | ']' => self.close(c == '}'),
            ':' => self.emit(":"),
            ',' => {
                self.emit(",");
                if self.stack.last() == Some(&true) {
                    self.expect_key = true;
                }
            }
            c if c.is_whitespace() => {}
            _ => self.broken = true,
        }
    }

    fn open(&mut self, object: bool) {
        self.value_starts();
        self.stack.push(object);
        self.keys.push(None);
        self.emit(if object { "{" } else { "[" });
        self.expect_key = object;
        if object && self.depth() == self.call_depth {
            self.calls.push(CallState::default());
            self.args_at = None;
        }
    }

    fn close(&mut self, object: bool) {
        if self.stack.pop() != Some(object) {
            self.broken = true;
            return;
        }
        self.keys.pop();
        // The closing bracket of the arguments value itself is still theirs.
        let closing_args = self.args_at == Some(self.depth() + 1);
        if closing_args || self.in_args() {
            self.stack.push(object);
            self.emit(if object { "}" } else { "]" });
            self.stack.pop();
        }
        if closing_args {
            self.args_at = None;
        }
        self.expect_key = false;
    }

    /// A value begins at the current depth: the arguments when it is the
    /// value of an arguments key in a call object.
    fn value_starts(&mut self) {
        if self.depth() == self.call_depth && self.stack.last() == Some(&true) && !self.expect_key {
            let key = self.keys.last().cloned().flatten();
            if key.is_some_and(|k| self.args_keys.contains(&k.as_str())) && !self.calls.is_empty() {
                self.args_at = Some(self.depth() + 1);
            }
        }
    }

    fn string(&mut self, raw: &str) {
        let Ok(s) = serde_json::from_str::<String>(raw) else {
            self.broken = true;
            return;
        };
        if self.stack.last() == Some(&true) && self.expect_key {
            self.expect_key = false;
            if let Some(k) = self.keys.last_mut() {
                *k = Some(s.clone());
            }
            self.emit(&serde_json::to_string(&s).unwrap_or_default());
            return;
        }
        let at_call_keys = self.depth() == self.call_depth && self.stack.last() == Some(&true);
        if at_call_keys && !self.calls.is_empty() {
            let key = self.keys.last().cloned().flatten();
            let index = self.calls.len() - 1;
            match key.as_deref() {
                Some("name") if self.calls[index].name.is_none() => {
                    self.calls[index].name = Some(s);
                    self.flush(index);
                    return;
                }
                Some(k) if self.args_keys.contains(&k) => {
                    self.calls[index].opaque = true;
                    return;
                }
                _ => {}
            }
        }
        self.emit(&serde_json::to_string(&s).unwrap_or_default());
    }

    fn scalar(&mut self, raw: &str) {
        match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(v) if !v.is_string() => {
                self.value_starts();
                let was = self.args_at;
                self.emit(&v.to_string());
                // A scalar arguments value ends where it ends.
                if was == Some(self.depth() + 1) {
                    self.args_at = None;
                }
            }
            _ => self.broken = true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event for `text` fed in pieces of `size` bytes (on char bounds).
    fn run(text: &str, depth: usize, size: usize) -> Vec<(String, String)> {
        let mut s = ArgScanner::new(depth, "arguments");
        let mut calls: Vec<(String, String)> = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let mut end = (at + size).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            s.feed(&text[at..end]);
            at = end;
            for e in s.take() {
                match e {
                    ArgEvent::Call { index, name } => {
                        assert_eq!(index, calls.len());
                        calls.push((name, String::new()));
                    }
                    ArgEvent::Args { index, fragment } => calls[index].1.push_str(&fragment),
                }
            }
        }
        calls
    }

    #[test]
    fn fragments_reassemble_to_serde_json_compact_arguments() {
        let args = r#"{ "city" : "Par\u00e9s \"x\"\/", "n": 1.50, "e": 1e3, "ok": true, "none": null,
                       "l": [1, {"k": [] }, "a"], "z": {} }"#;
        let want = serde_json::from_str::<serde_json::Value>(args)
            .unwrap()
            .to_string();
        let text = format!("<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {args}}}\n</tool_call>\n<tool_call>{{\"arguments\": {{\"tz\": \"UTC\"}}, \"name\": \"get_time\"}}</tool_call>");
        for size in [1, 2, 3, 7, 1000] {
            let calls = run(&text, 1, size);
            assert_eq!(
                calls,
                vec![
                    ("get_weather".to_string(), want.clone()),
                    ("get_time".to_string(), r#"{"tz":"UTC"}"#.to_string()),
                ],
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn lists_and_the_envelope_find_their_calls() {
        let list = r#"[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#;
        assert_eq!(
            run(list, 2, 4),
            vec![("a".into(), r#"{"x":1}"#.into()), ("b".into(), "{}".into())]
        );
        let env = r#"{"tool_calls": [{"name": "a", "arguments": {"x": [true]}}]}"#;
        assert_eq!(run(env, 3, 5), vec![("a".into(), r#"{"x":[true]}"#.into())]);
    }

    #[test]
    fn arguments_held_until_the_name_and_string_arguments_not_streamed() {
        let mut s = ArgScanner::new(1, "arguments");
        s.feed(r#"{"arguments": {"x": 1}"#);
        assert!(s.take().is_empty(), "nothing before the name");
        s.feed(r#", "name": "f"}"#);
        assert_eq!(
            s.take(),
            vec![
                ArgEvent::Call {
                    index: 0,
                    name: "f".into()
                },
                ArgEvent::Args {
                    index: 0,
                    fragment: r#"{"x":1}"#.into()
                },
            ]
        );
        let calls = run(r#"{"name": "g", "arguments": "{\"x\": 1}"}"#, 1, 3);
        assert_eq!(calls, vec![("g".into(), String::new())]);
    }
}
