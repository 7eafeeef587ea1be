//! Fuzzing the frame decoder with proptest: arbitrary bytes, and streams of valid, mutated
//! and truncated frames cut at random points, never panic and always make progress; valid
//! frames decode to what was encoded. `PROPTEST_CASES=N` runs longer (CI runs the default).

use headroom::command::{Command, Value};
use headroom::proto::{decode, frame_keys, Decoded, Request, KEY_MAX_BYTES};
use proptest::prelude::*;

const MAX_VALUE: usize = 4096;

fn frame(opcode: u8, extras: &[u8], key: &[u8], value: &[u8], cas: u64, opaque: u32) -> Vec<u8> {
    let mut out = Vec::new();
    headroom::proto::write_request(&mut out, opcode, (extras, key, value), opaque, cas);
    out
}

/// Frames of every known opcode with plausible (and sometimes wrong) extras.
fn any_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![0x00u8..=0x1e, Just(0x23u8), Just(0x24u8), any::<u8>()],
        prop_oneof![Just(0usize), Just(4), Just(8), Just(20), 0usize..32],
        proptest::collection::vec(any::<u8>(), 0..300),
        proptest::collection::vec(any::<u8>(), 0..5000),
        any::<u64>(),
        any::<u32>(),
    )
        .prop_map(|(opcode, extras_len, key, value, cas, opaque)| {
            frame(opcode, &vec![7u8; extras_len], &key, &value, cas, opaque)
        })
}

/// What a connection does with a stream: decode, skip, stop at close. Returns frames seen.
fn drive(stream: &[u8], chunk_sizes: &[usize]) -> usize {
    let mut buffered: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut skip: u64 = 0;
    let mut frames = 0;
    let mut chunks = chunk_sizes.iter().cycle();
    loop {
        if skip > 0 {
            let drop = (skip as usize).min(buffered.len());
            buffered.drain(..drop);
            skip -= drop as u64;
        }
        let outcome = if skip > 0 {
            None
        } else {
            Some(decode(&buffered, MAX_VALUE))
        };
        match outcome {
            Some(Decoded::Request {
                consumed,
                skip_after,
                request,
                ..
            }) => {
                assert!(consumed <= buffered.len() && consumed >= 24);
                if let Some(key) = request.key() {
                    assert!(key.len() <= KEY_MAX_BYTES);
                }
                if let Request::Run {
                    command: Command::Store { value, .. },
                    ..
                } = request
                {
                    assert!(value.len() <= MAX_VALUE as u64);
                }
                buffered.drain(..consumed);
                skip = skip_after;
                frames += 1;
                continue;
            }
            Some(Decoded::Reject {
                skip: frame_skip,
                close,
                ..
            }) => {
                frames += 1;
                if close {
                    return frames;
                }
                assert!(
                    frame_skip >= 24,
                    "a kept connection always moves past the frame"
                );
                skip = frame_skip;
                continue;
            }
            Some(Decoded::Close { .. }) => return frames,
            Some(Decoded::Incomplete { needed }) => {
                assert!(
                    needed > buffered.len(),
                    "incomplete must ask for more than it has"
                );
                assert!(
                    needed <= 24 + 255 + KEY_MAX_BYTES + MAX_VALUE,
                    "never buffers an oversized frame"
                );
            }
            None => {}
        }
        if fed == stream.len() {
            return frames;
        }
        let take = (*chunks.next().unwrap()).clamp(1, stream.len() - fed);
        buffered.extend_from_slice(&stream[fed..fed + take]);
        fed += take;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2000)) {
        let _ = decode(&bytes, MAX_VALUE);
        let mut with_magic = bytes.clone();
        if let Some(first) = with_magic.first_mut() {
            *first = 0x80;
        }
        let _ = decode(&with_magic, MAX_VALUE);
    }

    #[test]
    fn streams_of_frames_mutations_and_cuts_are_handled(
        frames in proptest::collection::vec(any_frame(), 1..20),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        chunks in proptest::collection::vec(1usize..700, 1..8),
        truncate in any::<prop::sample::Index>(),
    ) {
        let mut stream: Vec<u8> = frames.concat();
        for (at, byte) in mutations {
            let i = at.index(stream.len());
            stream[i] = byte;
        }
        let cut = truncate.index(stream.len() + 1);
        drive(&stream[..cut], &chunks);
    }

    /// The look ahead's frame walk reports the key of every whole frame up to its limit, in
    /// order, and stops at the end of the last (a cut frame is not reported); on arbitrary
    /// bytes it never panics nor reads past the buffer.
    #[test]
    fn frame_keys_reports_whole_frames_only(
        frames in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..40), 0usize..3, 0usize..100), 1..24),
        most in 1usize..20,
        truncate in any::<prop::sample::Index>(),
        noise in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let built: Vec<Vec<u8>> = frames
            .iter()
            .map(|(key, extras, value)| frame(0x01, &vec![1; *extras * 4], key, &vec![2; *value], 0, 0))
            .collect();
        let stream = built.concat();
        let cut = truncate.index(stream.len() + 1);
        let mut seen = Vec::new();
        let end = frame_keys(&stream[..cut], most, |key| seen.push(key.to_vec()));
        let mut whole = 0;
        let mut expected_end = 0;
        for bytes in &built {
            if whole == most || expected_end + bytes.len() > cut {
                break;
            }
            expected_end += bytes.len();
            whole += 1;
        }
        prop_assert_eq!(end, expected_end);
        let expected: Vec<Vec<u8>> = frames[..whole].iter().map(|(key, _, _)| key.clone()).collect();
        prop_assert_eq!(seen, expected);
        let end = frame_keys(&noise, most, |_| {});
        prop_assert!(end <= noise.len());
    }

    #[test]
    fn valid_sets_round_trip(
        key in proptest::collection::vec(any::<u8>(), 1..=250),
        value in proptest::collection::vec(any::<u8>(), 0..MAX_VALUE),
        flags in any::<u32>(),
        expiry in any::<u32>(),
        cas in any::<u64>(),
    ) {
        let mut extras = flags.to_be_bytes().to_vec();
        extras.extend_from_slice(&expiry.to_be_bytes());
        let bytes = frame(0x01, &extras, &key, &value, cas, 1);
        match decode(&bytes, MAX_VALUE) {
            Decoded::Request {
                request: Request::Run {
                    command: Command::Store { key: k, value: v, flags: f, expiry: e, cas: c, .. },
                    quiet,
                    ..
                },
                consumed,
                ..
            } => {
                prop_assert_eq!((k, v, f, e, c, quiet, consumed), (&key[..], Value::Whole(&value[..]), flags, expiry, cas, false, bytes.len()));
            }
            other => prop_assert!(false, "{:?}", other),
        }
    }
}
