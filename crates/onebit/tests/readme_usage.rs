//! The README's usage block lists every flag `--help` lists (issue 31:
//! "the README's usage lists every flag `--help` lists"), for every
//! subcommand: a flag added to the CLI without a word in the README fails
//! here, naming it. The oracle is clap's own help text, not a list kept here.

use std::process::Command;

fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_onebit"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "onebit {args:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// The long flags of a help text: `--name` at the start of an option line.
fn flags(help: &str) -> Vec<String> {
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            if !l.starts_with('-') {
                return None;
            }
            let at = l.find("--")?;
            let name: String = l[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect();
            (name.len() > 2).then_some(name)
        })
        .filter(|f| f != "--help" && f != "--version")
        .collect()
}

/// The subcommands `onebit --help` lists.
fn subcommands() -> Vec<String> {
    let h = help(&["--help"]);
    let start = h.find("Commands:").expect("a Commands: section");
    h[start..]
        .lines()
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

#[test]
fn the_readme_names_every_flag_of_every_subcommand() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let cmds = subcommands();
    assert!(cmds.iter().any(|c| c == "serve"), "{cmds:?}");
    // The parser sees the flags (a command may have none: `list`).
    assert!(flags(&help(&["serve", "--help"])).len() > 20);
    let mut missing = Vec::new();
    for c in &cmds {
        let fs = flags(&help(&[c, "--help"]));
        for f in fs {
            // A flag is named when it appears as itself, not as the prefix
            // of a longer one (`--draft` inside `--draft-max`).
            let named = readme.match_indices(&f).any(|(i, _)| {
                !readme[i + f.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            if !named {
                missing.push(format!("{c} {f}"));
            }
        }
    }
    assert!(missing.is_empty(), "README does not name: {missing:?}");
}
