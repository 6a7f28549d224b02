//! The ggml tensor types as a table: id, name, elements per block, bytes per block.

/// A ggml tensor type. Only the types listed here are readable; any other id
/// in a file is refused by name when the file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    BF16,
    /// OCP microscaling FP4: 32 E2M1 codes sharing one E8M0 exponent.
    MXFP4,
}

/// (type, ggml id, name, elements per block, bytes per block)
const TABLE: &[(GgmlType, u32, &str, usize, usize)] = &[
    (GgmlType::F32, 0, "F32", 1, 4),
    (GgmlType::F16, 1, "F16", 1, 2),
    (GgmlType::Q4_0, 2, "Q4_0", 32, 18),
    (GgmlType::Q4_1, 3, "Q4_1", 32, 20),
    (GgmlType::Q5_0, 6, "Q5_0", 32, 22),
    (GgmlType::Q5_1, 7, "Q5_1", 32, 24),
    (GgmlType::Q8_0, 8, "Q8_0", 32, 34),
    (GgmlType::Q8_1, 9, "Q8_1", 32, 36),
    (GgmlType::Q2K, 10, "Q2_K", 256, 84),
    (GgmlType::Q3K, 11, "Q3_K", 256, 110),
    (GgmlType::Q4K, 12, "Q4_K", 256, 144),
    (GgmlType::Q5K, 13, "Q5_K", 256, 176),
    (GgmlType::Q6K, 14, "Q6_K", 256, 210),
    (GgmlType::Q8K, 15, "Q8_K", 256, 292),
    (GgmlType::BF16, 30, "BF16", 1, 2),
    (GgmlType::MXFP4, 39, "MXFP4", 32, 17),
];

/// The ggml type ids onebit does not read, with ggml's names for them
/// (`enum ggml_type` in ggml/include/ggml.h of the llama.cpp the fixtures
/// are built from, the name after `GGML_TYPE_`; ids ggml removed keep their
/// old names), so a file holding one is refused by name: the i-quants
/// (IQ1_S..IQ4_XS), the ternary and plain integer types, NVFP4.
pub const UNREAD_TYPES: [(u32, &str); 25] = [
    (4, "Q4_2"),
    (5, "Q4_3"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
    (40, "NVFP4"),
];

/// ggml's name for a type id onebit does not read (see [`UNREAD_TYPES`]).
pub fn unread_type_name(id: u32) -> Option<&'static str> {
    UNREAD_TYPES.iter().find(|r| r.0 == id).map(|r| r.1)
}

impl GgmlType {
    fn row(self) -> &'static (GgmlType, u32, &'static str, usize, usize) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every variant is in TABLE")
    }
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.1 == id).map(|r| r.0)
    }
    pub fn from_name(name: &str) -> Option<Self> {
        TABLE
            .iter()
            .find(|r| r.2.eq_ignore_ascii_case(name))
            .map(|r| r.0)
    }
    pub fn id(self) -> u32 {
        self.row().1
    }
    pub fn name(self) -> &'static str {
        self.row().2
    }
    /// Elements encoded by one block.
    pub fn block_len(self) -> usize {
        self.row().3
    }
    /// Bytes one block occupies.
    pub fn block_bytes(self) -> usize {
        self.row().4
    }
    /// Bytes a row of `n` elements occupies, or `None` when `n` is not a whole
    /// number of blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let bl = self.block_len() as u64;
        if !n.is_multiple_of(bl) {
            return None;
        }
        (n / bl).checked_mul(self.block_bytes() as u64)
    }
    pub fn is_quantized(self) -> bool {
        self.block_len() > 1
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_match_ggml_struct_layouts() {
        // Written out from the block structs: d (f16, 2 bytes) + 32 nibbles (16 bytes) ...
        assert_eq!(GgmlType::Q4_0.block_bytes(), 2 + 16);
        assert_eq!(GgmlType::Q4_1.block_bytes(), 2 + 2 + 16);
        assert_eq!(GgmlType::Q5_0.block_bytes(), 2 + 4 + 16);
        assert_eq!(GgmlType::Q5_1.block_bytes(), 2 + 2 + 4 + 16);
        assert_eq!(GgmlType::Q8_0.block_bytes(), 2 + 32);
        // K-quants: 256 elements; scales/mins packed per the ggml-common.h layouts.
        assert_eq!(GgmlType::Q2K.block_bytes(), 16 + 64 + 2 + 2);
        assert_eq!(GgmlType::Q3K.block_bytes(), 32 + 64 + 12 + 2);
        assert_eq!(GgmlType::Q4K.block_bytes(), 2 + 2 + 12 + 128);
        assert_eq!(GgmlType::Q5K.block_bytes(), 2 + 2 + 12 + 32 + 128);
        assert_eq!(GgmlType::Q6K.block_bytes(), 128 + 64 + 16 + 2);
        assert_eq!(GgmlType::Q8K.block_bytes(), 4 + 256 + 32);
        // MXFP4: one E8M0 exponent byte + 32 nibbles.
        assert_eq!(GgmlType::MXFP4.block_bytes(), 1 + 16);
    }

    #[test]
    fn unread_types_are_named_as_ggml_h_and_never_collide_with_read_ones() {
        // Spot values of ggml.h's enum ggml_type.
        assert_eq!(unread_type_name(16), Some("IQ2_XXS"));
        assert_eq!(unread_type_name(23), Some("IQ4_XS"));
        assert_eq!(unread_type_name(29), Some("IQ1_M"));
        assert_eq!(unread_type_name(20), Some("IQ4_NL"));
        assert_eq!(unread_type_name(13), None);
        assert!(UNREAD_TYPES.windows(2).all(|w| w[0].0 < w[1].0));
        for (id, name) in UNREAD_TYPES {
            assert!(GgmlType::from_id(id).is_none(), "{name} ({id}) is read");
            assert!(GgmlType::from_name(name).is_none(), "{name}");
        }
    }

    #[test]
    fn row_bytes_refuses_partial_blocks() {
        assert_eq!(GgmlType::Q4_0.row_bytes(64), Some(36));
        assert_eq!(GgmlType::Q4_0.row_bytes(33), None);
        assert_eq!(GgmlType::F32.row_bytes(1 << 63), None); // 2^65 bytes
    }
}
