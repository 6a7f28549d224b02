//! GGUF `general.file_type`: the file's declared weight type, as llama.cpp
//! numbers and names it (`enum llama_ftype` in include/llama.h, the name
//! being the enum's after `LLAMA_FTYPE_MOSTLY_`; the numbers llama.cpp
//! removed are absent). A table: the invariant is that every entry is
//! llama.h's, number for number.

/// (value, name) for every `llama_ftype` llama.cpp still defines.
pub const FILE_TYPES: [(u32, &str); 37] = [
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (19, "IQ2_XXS"),
    (20, "IQ2_XS"),
    (21, "Q2_K_S"),
    (22, "IQ3_XS"),
    (23, "IQ3_XXS"),
    (24, "IQ1_S"),
    (25, "IQ4_NL"),
    (26, "IQ3_S"),
    (27, "IQ3_M"),
    (28, "IQ2_S"),
    (29, "IQ2_M"),
    (30, "IQ4_XS"),
    (31, "IQ1_M"),
    (32, "BF16"),
    (36, "TQ1_0"),
    (37, "TQ2_0"),
    (38, "MXFP4_MOE"),
    (39, "NVFP4"),
    (40, "Q1_0"),
    (41, "Q2_0"),
    // Not a type a file declares but llama.cpp's "not specified" marker.
    (1024, "GUESSED"),
];

/// The GGUF key that holds the file type.
pub const FILE_TYPE_KEY: &str = "general.file_type";

/// The name of `general.file_type` value `v`, `None` for a value llama.cpp
/// does not define.
pub fn file_type_name(v: u32) -> Option<&'static str> {
    FILE_TYPES.iter().find(|(n, _)| *n == v).map(|(_, s)| *s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_llama_h() {
        // Spot values of include/llama.h's enum, and a removed one (4,
        // Q4_1_SOME_F16) that must not be named.
        assert_eq!(file_type_name(15), Some("Q4_K_M"));
        assert_eq!(file_type_name(3), Some("Q4_1"));
        assert_eq!(file_type_name(8), Some("Q5_0"));
        assert_eq!(file_type_name(32), Some("BF16"));
        assert_eq!(file_type_name(4), None);
        assert_eq!(file_type_name(33), None);
        // Sorted and unique.
        assert!(FILE_TYPES.windows(2).all(|w| w[0].0 < w[1].0));
    }
}
