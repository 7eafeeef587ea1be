//! The placement trace format (`docs/benchmarks.md`): one event per line,
//! `<time_us> <put|remove> <key> <size_bytes>`, `#` starts a comment. A malformed line is
//! reported with its number and skipped, never silently accepted.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Put,
    Remove,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub time_us: u64,
    pub kind: EventKind,
    pub key: String,
    pub size_bytes: u64,
}

/// A line that was not an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LineError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

/// Parses a whole trace: the events, and every malformed line with why.
pub fn parse(text: &str) -> (Vec<Event>, Vec<LineError>) {
    let mut events = Vec::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match parse_line(line) {
            Ok(event) => events.push(event),
            Err(message) => errors.push(LineError {
                line: i + 1,
                message,
            }),
        }
    }
    (events, errors)
}

fn parse_line(line: &str) -> Result<Event, String> {
    let fields: Vec<&str> = line.split_whitespace().collect();
    if fields.len() != 4 {
        return Err(format!(
            "expected 4 fields '<time_us> <put|remove> <key> <size_bytes>', found {}",
            fields.len()
        ));
    }
    let time_us = fields[0]
        .parse::<u64>()
        .map_err(|_| format!("time '{}' is not a whole number of microseconds", fields[0]))?;
    let kind = match fields[1] {
        "put" => EventKind::Put,
        "remove" => EventKind::Remove,
        other => return Err(format!("event '{other}' is neither put nor remove")),
    };
    let size_bytes = fields[3]
        .parse::<u64>()
        .map_err(|_| format!("size '{}' is not a whole number of bytes", fields[3]))?;
    if kind == EventKind::Put && size_bytes == 0 {
        return Err("a put of 0 bytes".into());
    }
    Ok(Event {
        time_us,
        kind,
        key: fields[2].to_string(),
        size_bytes,
    })
}

/// One event as a line of the format.
pub fn format_event(event: &Event) -> String {
    let kind = match event.kind {
        EventKind::Put => "put",
        EventKind::Remove => "remove",
    };
    format!(
        "{} {kind} {} {}",
        event.time_us, event.key, event.size_bytes
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_lines_comments_and_blanks() {
        let text =
            "# a trace\n\n10 put k1 4096\n20 remove k1 4096  # freed\n   \n30 put big 1610612736\n";
        let (events, errors) = parse(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(events.len(), 3);
        assert_eq!(
            events[1],
            Event {
                time_us: 20,
                kind: EventKind::Remove,
                key: "k1".into(),
                size_bytes: 4096
            }
        );
        assert_eq!(events[2].size_bytes, 1_610_612_736);
        assert_eq!(format_event(&events[0]), "10 put k1 4096");
    }

    #[test]
    fn bad_lines_are_reported_with_their_number_and_skipped() {
        let text =
            "1 put a 10\n2 put b\nx put c 10\n3 get d 10\n4 put e -5\n5 put f 0\n6 remove a 10\n";
        let (events, errors) = parse(text);
        assert_eq!(events.len(), 2);
        let lines: Vec<usize> = errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, vec![2, 3, 4, 5, 6]);
        assert!(errors[0].message.contains("4 fields"));
        assert!(errors[1].message.contains("time 'x'"));
        assert!(errors[2].message.contains("'get'"));
        assert!(errors[3].message.contains("size '-5'"));
        assert!(errors[4].message.contains("0 bytes"));
        assert_eq!(
            errors[0].to_string(),
            "line 2: expected 4 fields '<time_us> <put|remove> <key> <size_bytes>', found 3"
        );
    }
}
